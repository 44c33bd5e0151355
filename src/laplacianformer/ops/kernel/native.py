"""Loader for the C loops of the CPU path (``csrc/pairwise.c``), built at first use.

``load_library`` / ``_build`` also serve the other C sources (``ops/newton_schulz/native.py``).

The source has no Python or torch headers: ``cc -O3 -march=native -fopenmp`` builds it in a few seconds
into a per-user cache (``$LAPLACIANFORMER_CACHE`` or ``~/.cache/laplacianformer``), keyed by the source,
the flags and the CPU's feature flags, and it is loaded with ctypes (the GIL is released during calls).
Nothing is built at install time. When no C compiler works, ``load()`` returns None with the reason in
``load_error()`` and the CPU path falls back to chunked PyTorch.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
from pathlib import Path

import torch

from ..layout import last_dim_contiguous

_SRC = Path(__file__).with_name("csrc") / "pairwise.c"
_FLAGS = ["-O3", "-march=native", "-ffp-contract=fast", "-fopenmp", "-shared", "-fPIC", "-std=c99"]
_error: list[str] = []


def _cpu_signature() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return line
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _cache_dir() -> Path:
    root = os.environ.get("LAPLACIANFORMER_CACHE") or os.path.join(os.path.expanduser("~"), ".cache", "laplacianformer")
    return Path(root)


def _build(cc: str, src: Path | None = None) -> Path:
    """The shared library of the C source ``src`` (``pairwise.c`` by default), built into the cache unless
    it is there already (named after the source's stem and a hash of the source, flags and CPU)."""
    src = _SRC if src is None else src
    key = hashlib.sha256(
        src.read_bytes() + " ".join([cc, *_FLAGS]).encode() + _cpu_signature().encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"{src.stem}-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        # An absolute path: the sources include themselves through __FILE__ (once per scalar type).
        path = str(src.resolve())
        proc = subprocess.run([cc, *_FLAGS, "-o", tmp, path], capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            raise RuntimeError(f"{cc} failed: {proc.stderr.strip()[:500]}")
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return target


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        dist = getattr(lib, f"lf_dist_{suffix}")
        dist.argtypes = [p, i64, i64, p, i64, i64, p, i64, i64, i64, i64, real, i32, i32]
        dist.restype = i32
        grad = getattr(lib, f"lf_grad_{suffix}")
        grad.argtypes = [p, i64, i64, p, i64, i64, p, p, p, i64, i64, p, i64, i64, i64, i64, i64, i64, real, i32, i32]
        grad.restype = i32


def load_library(src: Path, signatures, errors: list[str]) -> ctypes.CDLL | None:
    """Builds (see ``_build``) and loads the C source ``src``, sets its ctypes signatures with
    ``signatures(lib)``; None with the reason appended to ``errors`` when disabled
    (LAPLACIANFORMER_NO_NATIVE=1), without a C compiler, or when building or loading fails."""
    if os.environ.get("LAPLACIANFORMER_NO_NATIVE", "0") not in ("", "0"):
        errors.append("disabled by LAPLACIANFORMER_NO_NATIVE")
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        errors.append("no C compiler (cc/gcc) on PATH")
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc, src)))
        signatures(lib)
    except Exception as exc:
        errors.append(f"{type(exc).__name__}: {exc}")
        return None
    return lib


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled library, or None (see ``load_error()``). Set LAPLACIANFORMER_NO_NATIVE=1 to disable."""
    return load_library(_SRC, _signatures, _error)


def load_error() -> str:
    """Why ``load()`` returned None ('' when it did not)."""
    return _error[-1] if _error else ""


_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}
_CHUNKS = 64


_SERIAL_WORK = 1 << 18


def _ptr(t: torch.Tensor) -> int:
    return t.data_ptr()


def _threads(work: int) -> int:
    """One thread for small problems (an OpenMP fork costs more than it saves), else torch's count."""
    return 1 if work < _SERIAL_WORK else torch.get_num_threads()


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


def pairwise_distance_native(
    x: torch.Tensor, y: torch.Tensor, l1: bool, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """scale · D (B, N, M) for x (B, N, d), y (B, M, d) of one float dtype (into ``out``, a contiguous
    (B, N, M) tensor, when given). x and y may have any batch and row strides; they are copied only when
    their last dimension is not contiguous."""
    lib = load()
    x, y = last_dim_contiguous(x), last_dim_contiguous(y)
    b, n, d = x.shape
    m = y.shape[1]
    if out is None:
        out = torch.empty(b, n, m, dtype=x.dtype)
    _check(getattr(lib, f"lf_dist_{_SUFFIX[x.dtype]}")(
        _ptr(x), x.stride(0), x.stride(1), _ptr(y), y.stride(0), y.stride(1), _ptr(out),
        b, n, m, d, scale, int(l1), _threads(b * n * m * d),
    ))
    return out


def pairwise_distance_grad_native(
    x: torch.Tensor,
    y: torch.Tensor,
    g: torch.Tensor,
    c: torch.Tensor | None,
    scale: float,
    l1: bool,
    dx: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX (B, N, d), dY (B, M, d)) for dL/dD = g · c · scale (g, c: contiguous (B, N, M); c None means 1).

    One dtype. x and y may have any batch and row strides (copied only when their last dimension is not
    contiguous); dX is written into ``dx`` when given (any batch and row strides, last dimension
    contiguous), else into a new contiguous tensor; dY is contiguous."""
    lib = load()
    x, y = last_dim_contiguous(x), last_dim_contiguous(y)
    b, n, d = x.shape
    m = y.shape[1]
    if dx is None:
        dx = torch.empty(b, n, d, dtype=x.dtype)
    elif dx.stride(2) != 1 and d > 1:
        raise ValueError("dx: the last dimension must be contiguous")
    dy = torch.empty(b, m, d, dtype=x.dtype)
    chunks, rows = _grad_chunks(b, n)
    _check(getattr(lib, f"lf_grad_{_SUFFIX[x.dtype]}")(
        _ptr(x), x.stride(0), x.stride(1), _ptr(y), y.stride(0), y.stride(1), _ptr(g),
        None if c is None else _ptr(c), _ptr(dx), dx.stride(0), dx.stride(1), _ptr(dy),
        b, n, m, d, chunks, rows, scale, int(l1), _threads(b * n * m * d),
    ))
    return dx, dy
