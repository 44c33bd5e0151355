"""The C loops of the CPU path (``csrc/pairwise.c``, docs/DESIGN.md §1, §6), built at first use by
``ops/_clib.py`` (build cache, LAPLACIANFORMER_NO_NATIVE). When no C compiler works, ``load()`` returns
None with the reason in ``load_error()`` and the CPU path falls back to chunked PyTorch.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .._clib import CLibrary, threads_for_work
from ..layout import last_dim_contiguous

_SRC = Path(__file__).with_name("csrc") / "pairwise.c"


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        dist = getattr(lib, f"lf_dist_{suffix}")
        dist.argtypes = [p, i64, i64, p, i64, i64, p, i64, i64, i64, i64, real, i32, i32]
        dist.restype = i32
        grad = getattr(lib, f"lf_grad_{suffix}")
        grad.argtypes = [p, i64, i64, p, i64, i64, p, p, p, i64, i64, p, i64, i64, i64, i64, i64, i64, real, i32, i32]
        grad.restype = i32


LIBRARY = CLibrary(_SRC, _signatures)
load, available, load_error = LIBRARY.load, LIBRARY.available, LIBRARY.error


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CHUNKS = 64


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("laplacianformer C loops: workspace allocation failed")


def _grad_chunks(b: int, n: int) -> tuple[int, int]:
    """(chunks, rows per chunk) of each batch's N rows for the backward's dY parts: about _CHUNKS tasks over
    all batches (one chunk per batch from _CHUNKS batches on), rows rounded up to a multiple of 8 so that
    the C loops' row blocks do not straddle chunks. Depends on the shape only, never the thread count."""
    chunks = max(1, min(-(-_CHUNKS // max(1, b)), n))
    rows = -(-max(1, n) // chunks)
    rows = -(-rows // 8) * 8
    return max(1, -(-n // rows)), rows


def _launch(
    name: str, x: torch.Tensor, y: torch.Tensor, buffers: tuple, tiling: tuple, scale: float, l1: bool
) -> None:
    """One call of ``lf_<name>_<f32|f64>``: x (B, N, d) and y (B, M, d) with their batch and row strides (each
    copied only when its last dimension is not contiguous), then ``buffers``, the sizes B, N, M, d,
    ``tiling``, scale, l1 and the thread count for the B·N·M·d work (``load()`` must not be None)."""
    x, y = last_dim_contiguous(x), last_dim_contiguous(y)
    b, n, d = x.shape
    m = y.shape[1]
    _check(getattr(load(), f"lf_{name}_{_SUFFIX[x.dtype]}")(
        _ptr(x), x.stride(0), x.stride(1), _ptr(y), y.stride(0), y.stride(1), *buffers,
        b, n, m, d, *tiling, scale, int(l1), threads_for_work(b * n * m * d),
    ))


def pairwise_distance_native(
    x: torch.Tensor, y: torch.Tensor, l1: bool, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """scale · D (B, N, M) for x (B, N, d), y (B, M, d) of one float dtype (into ``out``, a contiguous
    (B, N, M) tensor, when given). x and y may have any batch and row strides; they are copied only when
    their last dimension is not contiguous."""
    if out is None:
        out = torch.empty(x.shape[0], x.shape[1], y.shape[1], dtype=x.dtype)
    _launch("dist", x, y, (_ptr(out),), (), scale, l1)
    return out


def pairwise_distance_grad_native(
    x: torch.Tensor, y: torch.Tensor, g: torch.Tensor, c: torch.Tensor | None, scale: float, l1: bool,
    dx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX (B, N, d), dY (B, M, d)) for dL/dD = g · c · scale (g, c: contiguous (B, N, M); c None means 1).

    One dtype. x and y may have any batch and row strides (copied only when their last dimension is not
    contiguous); dX is written into ``dx`` when given (any batch and row strides, last dimension
    contiguous), else into a new contiguous tensor; dY is contiguous."""
    b, n, d = x.shape
    if dx is None:
        dx = torch.empty(b, n, d, dtype=x.dtype)
    elif dx.stride(2) != 1 and d > 1:
        raise ValueError("dx: the last dimension must be contiguous")
    dy = torch.empty(b, y.shape[1], d, dtype=x.dtype)
    buffers = (_ptr(g), None if c is None else _ptr(c), _ptr(dx), dx.stride(0), dx.stride(1), _ptr(dy))
    _launch("grad", x, y, buffers, _grad_chunks(b, n), scale, l1)
    return dx, dy
