"""Loader for the C loops of the CPU path (``csrc/pairwise.c``), built at first use.

The source has no Python or torch headers: ``cc -O3 -march=native -fopenmp`` builds it in about a second
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

_SRC = Path(__file__).with_name("csrc") / "pairwise.c"
_FLAGS = ["-O3", "-march=native", "-fopenmp", "-shared", "-fPIC", "-std=c99"]
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


def _build(cc: str) -> Path:
    key = hashlib.sha256(
        _SRC.read_bytes() + " ".join([cc, *_FLAGS]).encode() + _cpu_signature().encode()
    ).hexdigest()[:16]
    target = _cache_dir() / f"pairwise-{key}.so"
    if target.exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        proc = subprocess.run([cc, *_FLAGS, "-o", tmp, str(_SRC)], capture_output=True, text=True, timeout=120)
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
        dist.argtypes = [p, p, p, i64, i64, i64, i64, real, i32, i32]
        dist.restype = None
        grad = getattr(lib, f"lf_grad_{suffix}")
        grad.argtypes = [p, p, p, p, p, p, i64, i64, i64, i64, i64, real, i32, i32]
        grad.restype = None


@functools.lru_cache(maxsize=1)
def load() -> ctypes.CDLL | None:
    """The compiled library, or None (see ``load_error()``). Set LAPLACIANFORMER_NO_NATIVE=1 to disable."""
    if os.environ.get("LAPLACIANFORMER_NO_NATIVE", "0") not in ("", "0"):
        _error.append("disabled by LAPLACIANFORMER_NO_NATIVE")
        return None
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        _error.append("no C compiler (cc/gcc) on PATH")
        return None
    try:
        lib = ctypes.CDLL(str(_build(cc)))
        _signatures(lib)
    except Exception as exc:
        _error.append(f"{type(exc).__name__}: {exc}")
        return None
    return lib


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


def pairwise_distance_native(
    x: torch.Tensor, y: torch.Tensor, l1: bool, scale: float = 1.0, out: torch.Tensor | None = None
) -> torch.Tensor:
    """scale · D (B, N, M) for contiguous x (B, N, d), y (B, M, d) of one float dtype (into ``out``, a
    contiguous (B, N, M) tensor, when given)."""
    lib = load()
    b, n, d = x.shape
    m = y.shape[1]
    yt = y.transpose(1, 2).contiguous()
    if out is None:
        out = torch.empty(b, n, m, dtype=x.dtype)
    getattr(lib, f"lf_dist_{_SUFFIX[x.dtype]}")(
        _ptr(x), _ptr(yt), _ptr(out), b, n, m, d, scale, int(l1), _threads(b * n * m * d)
    )
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
    """(dX (B, N, d), dY (B, M, d)) for dL/dD = g · c · scale (g, c: (B, N, M); c None means 1).

    All contiguous, one dtype; dX is written into ``dx`` when given."""
    lib = load()
    b, n, d = x.shape
    m = y.shape[1]
    chunks = max(1, min(_CHUNKS, n))
    if dx is None:
        dx = torch.empty_like(x)
    parts = torch.empty(b, chunks, m, d, dtype=x.dtype)
    getattr(lib, f"lf_grad_{_SUFFIX[x.dtype]}")(
        _ptr(x), _ptr(y), _ptr(g), None if c is None else _ptr(c), _ptr(dx), _ptr(parts),
        b, n, m, d, chunks, scale, int(l1), _threads(b * n * m * d),
    )
    return dx, parts.sum(1)
