"""The token-grid steps of CPU inference in C (``ops/csrc/grid.c``, docs/DESIGN.md §6.6): landmark pooling
(§2.1) and DWConv(V) with the heads merged into it (§4.5), each one C call instead of two products
(pooling by ``matmul``) or a convolution, a copy and an add.

    pool_grid_cpu(x, hw, landmarks) -> (B, H, m, d)          x (B, H, N, d), any batch/head/row strides
    dwconv_merge_cpu(heads, conv) -> (B, H, N, e)            a view of the (B, N, C) DWConv(V) + heads

Forward only (no autograd): the ``cpu`` backend of ``pooling`` declares ``grad=False``, and
``value_conv.add_value_conv`` calls the conv here only where no gradient is needed. float32 / float64 CPU
tensors; each output element is summed in a fixed order by one thread (results do not depend on the thread
count). Equal to ``pooling._pool_reference`` and ``value_conv.value_conv`` + the merge to float rounding
(tests/ops/test_grid_cpu.py). Built at first use by ``ops/_clib.py``; ``available()`` is False when it
cannot be, and the callers keep their PyTorch steps.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ._clib import CLibrary, threads_for_work

__all__ = ["available", "dwconv_merge_cpu", "pool_grid_cpu", "serves"]

_SRC = Path(__file__).with_name("csrc") / "grid.c"
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for suffix in _SUFFIX.values():
        pool = getattr(lib, f"lf_pool_{suffix}")
        pool.argtypes = [p, i64, i64, i64, i64, i64, i64, i64, i64, i64, i64, p, i32]
        pool.restype = i32
        conv = getattr(lib, f"lf_dwconv_merge_{suffix}")
        conv.argtypes = [p, i64, i64, i64, i64, i64, i64, p, p, p, i64, i64, i64, i64, i64, p, i32]
        conv.restype = i32


LIBRARY = CLibrary(_SRC, _signatures)
load, available, load_error = LIBRARY.load, LIBRARY.available, LIBRARY.error


def serves(*tensors: torch.Tensor) -> bool:
    """Whether the C steps take these tensors: CPU, one dtype of float32 / float64, no gradient needed, the
    library built."""
    t0 = tensors[0]
    return (t0.device.type == "cpu" and t0.dtype in _SUFFIX and all(t.dtype == t0.dtype for t in tensors)
            and not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)) and available())


def _grid(hw, n: int) -> tuple[int, int]:
    return (1, n) if hw is None else (int(hw[0]), int(hw[1]))


def pool_grid_cpu(x: torch.Tensor, hw, landmarks) -> torch.Tensor:
    """Adaptive average pooling of x (B, H, N, d) (last dimension contiguous or copied) on the (gh, gw) grid
    ``hw`` (None: a 1-D sequence, ``landmarks`` an int) to the (lh, lw) grid ``landmarks``: (B, H, lh·lw, d)."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    b, h, n, d = x.shape
    gh, gw = _grid(hw, n)
    lh, lw = (1, int(landmarks)) if hw is None else (int(landmarks[0]), int(landmarks[1]))
    out = x.new_empty(b, h, lh * lw, d)
    status = getattr(load(), f"lf_pool_{_SUFFIX[x.dtype]}")(
        x.data_ptr(), b, h, x.stride(0), x.stride(1), x.stride(2), gh, gw, lh, lw, d, out.data_ptr(),
        threads_for_work(b * h * n * d))
    if status != 0:
        raise MemoryError("laplacianformer grid pooling C loop: workspace allocation failed")
    return out


def dwconv_merge_cpu(heads: torch.Tensor, conv) -> torch.Tensor:
    """DWConv(V) + the heads merged, (B, H, N, e): a view of the (B, N, C) sum. heads (B, H, N, e); conv a
    ``value_conv.ValueConv`` (tokens (B, N, C), hw or None, weight (C, 1, 3, 3), bias (C,) or None) of the
    heads' dtype."""
    tokens, hw, weight, bias = conv
    if tokens.stride(-1) != 1:
        tokens = tokens.contiguous()
    if heads.stride(-1) != 1:
        heads = heads.contiguous()
    b, n, c = tokens.shape
    h, e = heads.shape[1], heads.shape[3]
    gh, gw = _grid(hw, n)
    taps = weight.reshape(c, 9).t().contiguous()
    bias = None if bias is None else bias.contiguous()
    out = tokens.new_empty(b, n, c)
    getattr(load(), f"lf_dwconv_merge_{_SUFFIX[tokens.dtype]}")(
        tokens.data_ptr(), b, gh, gw, c, tokens.stride(0), tokens.stride(1), taps.data_ptr(),
        None if bias is None else bias.data_ptr(), heads.data_ptr(), h, e, heads.stride(0), heads.stride(1),
        heads.stride(2), out.data_ptr(), threads_for_work(b * n * c * 9))
    return out.view(b, n, h, e).transpose(1, 2)
