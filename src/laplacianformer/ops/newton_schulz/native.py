"""The C Newton–Schulz loop of the CPU path (``csrc/newton_schulz.c``, docs/DESIGN.md §3, §6), built at
first use by ``ops/_clib.py`` like the kernel's C loops; ctypes releases the GIL during a call.
``newton_schulz_native`` is one C call per solve, float32/float64 CPU tensors, symmetric P; it gives
``naive.newton_schulz_iterate_reference``'s result to float rounding (same alpha, check schedule,
keep-best rule and tol stop). When no C compiler works, ``load()`` returns None with the reason in
``load_error()`` and the torch loop runs instead.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from .._clib import CLibrary, threads_for_work

_SRC = Path(__file__).with_name("csrc") / "newton_schulz.c"


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        fn = getattr(lib, f"lf_ns_{suffix}")
        fn.argtypes = [p, p, i64, i64, i64, i64, real, i32, i32]
        fn.restype = i32


LIBRARY = CLibrary(_SRC, _signatures)
load, available, load_error = LIBRARY.load, LIBRARY.available, LIBRARY.error


def threads_for(g: int, m: int, iters: int) -> int:
    """OpenMP threads for a solve: ``threads_for_work`` of the multiply-adds (2 m³ per step and matrix), at
    most one per matrix."""
    return max(1, min(g, threads_for_work(2 * g * max(1, iters) * m**3)))


def newton_schulz_native(
    p: torch.Tensor, iters: int, tol: float | None, check_every: int, threads: int | None = None
) -> torch.Tensor:
    """V ≈ P^{-1} for symmetric P (..., m, m), float32/float64 on the CPU, by the C loop (``load()`` must
    not be None). ``threads`` overrides the thread count (the result does not depend on it)."""
    shape = p.shape
    m = shape[-1]
    p3 = p.reshape(-1, m, m)
    if not p3.is_contiguous():
        p3 = p3.contiguous()
    g = p3.shape[0]
    out = torch.empty_like(p3)
    if g == 0 or m == 0:
        return out.reshape(shape)
    if threads is None:
        threads = threads_for(g, m, iters)
    fn = load().lf_ns_f32 if p3.dtype == torch.float32 else load().lf_ns_f64
    status = fn(
        p3.data_ptr(), out.data_ptr(), g, m, int(iters), int(check_every),
        0.0 if tol is None else float(tol), int(tol is not None), int(threads),
    )
    if status != 0:
        raise MemoryError("laplacianformer Newton–Schulz C loop: workspace allocation failed")
    return out.reshape(shape)
