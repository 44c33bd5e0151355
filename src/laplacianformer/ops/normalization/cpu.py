"""The fused injective / inline normalisation in C (``ops/csrc/normalization.c``, docs/DESIGN.md §4.3, §6).

Backend ``cpu`` of the op ``normalization``: forward and backward are one C call each (OpenMP over
(batch·head, row chunk) tasks, register-blocked products, the centring, scaling and reductions fused into
the row passes; formulas in ``ops/normalization/fused.py``). Per batch·head, c (Nq, m) = C_q, k (Nk, m) = C_k,
w (m, m) = W⁺ (or None: k is B itself), v (Nk, e) -> out (Nq, e).

Temporaries: the forward allocates the output and, when a gradient is needed, t = k̃ S' (Nk, m), which
the backward turns into dC_k in place (so the backward allocates only dC_q and dV); all else is
(m, m) / (m, e) / (N,) sized. A second backward through the same graph (``retain_graph``) recomputes t.
Sums over rows are added in a fixed order: results do not depend on the thread count. Built at first use
by ``ops/_clib.py``; when no C compiler works, ``available()`` is False and the op uses its other backends.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
from torch.autograd.function import once_differentiable

from .._clib import CLibrary, threads_for_work

_SRC = Path(__file__).parents[1] / "csrc" / "normalization.c"
_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _signatures(lib: ctypes.CDLL) -> None:
    p, i64, i32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    for suffix, real in (("f32", ctypes.c_float), ("f64", ctypes.c_double)):
        fwd = getattr(lib, f"lf_norm_fwd_{suffix}")
        fwd.argtypes = [p, i64, i64, p, i64, i64, p, i64, p, i64, i64, i64, i64, i64, i64, i64, real, real, i32,
                        p, p, p, p, p, i32]
        fwd.restype = i32
        bwd = getattr(lib, f"lf_norm_bwd_{suffix}")
        bwd.argtypes = [p, i64, i64, p, i64, i64, p, i64, p, i64, i64, p, i64, i64, i64, i64, i64, i64, i64, i32,
                        p, p, p, p, p, p, p, p, i32]
        bwd.restype = i32


LIBRARY = CLibrary(_SRC, _signatures)
load, available, load_error = LIBRARY.load, LIBRARY.available, LIBRARY.error


def _stats_size(m: int, e: int) -> int:
    return 2 * m + 2 * m * m + 2 * m * e + 2 * e


def _check(status: int) -> None:
    if status != 0:
        raise MemoryError("laplacianformer normalisation C loop: workspace allocation failed")


def _rows(t: torch.Tensor) -> torch.Tensor:
    """(G, R, C) with a contiguous last dimension (any batch and row strides)."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _mat(w: torch.Tensor | None) -> torch.Tensor | None:
    """(G, m, m) with contiguous matrices (any batch stride, 0 included)."""
    if w is None:
        return None
    m = w.shape[-1]
    return w if w.stride(-1) == 1 and (w.stride(-2) == m or m <= 1) else w.contiguous()


def _work(c, k, v) -> int:
    g, nq, m = c.shape
    return g * (nq + k.shape[1]) * m * (m + v.shape[2])


def _forward(c, k, w, v, eps: float, inj: bool, keep_t: bool, alpha: float = 1.0):
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    out = c.new_empty(g, nq, e)
    t = c.new_empty(g, nk, m) if inj and keep_t else None
    stats = c.new_empty(g, _stats_size(m, e))
    rinv = c.new_empty(g, nk)
    dsc = c.new_empty(g, nk)
    fn = getattr(load(), f"lf_norm_fwd_{_SUFFIX[c.dtype]}")
    _check(fn(
        c.data_ptr(), c.stride(0), c.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        None if w is None else w.data_ptr(), 0 if w is None else w.stride(0),
        v.data_ptr(), v.stride(0), v.stride(1), g, nq, nk, m, e, float(eps), float(alpha), int(inj),
        out.data_ptr(), None if t is None else t.data_ptr(), stats.data_ptr(), rinv.data_ptr(), dsc.data_ptr(),
        threads_for_work(_work(c, k, v)),
    ))
    return out, t, stats, rinv, dsc


def _backward(grad, c, k, w, v, inj: bool, stats, rinv, dsc, t):
    g, nq, m = c.shape
    nk, e = k.shape[1], v.shape[2]
    d_c = c.new_empty(g, nq, m)
    d_k = t if t is not None else c.new_empty(g, nk, m)
    d_v = c.new_empty(g, nk, e)
    d_w = None if w is None else c.new_empty(g, m, m)
    fn = getattr(load(), f"lf_norm_bwd_{_SUFFIX[c.dtype]}")
    _check(fn(
        c.data_ptr(), c.stride(0), c.stride(1), k.data_ptr(), k.stride(0), k.stride(1),
        None if w is None else w.data_ptr(), 0 if w is None else w.stride(0),
        v.data_ptr(), v.stride(0), v.stride(1), grad.data_ptr(), grad.stride(0), grad.stride(1),
        g, nq, nk, m, e, int(inj), stats.data_ptr(), rinv.data_ptr(), dsc.data_ptr(),
        None if t is None else t.data_ptr(), d_c.data_ptr(), d_k.data_ptr(),
        None if d_w is None else d_w.data_ptr(), d_v.data_ptr(), threads_for_work(_work(c, k, v)),
    ))
    return d_c, d_k, d_w, d_v


class NormalizationCPU(torch.autograd.Function):
    """out (G, Nq, e) for c (G, Nq, m), k (G, Nk, m), w (G, m, m) or None, v (G, Nk, e), float eps and
    ``inj`` (True: injective, False: inline); first-order backward (docs/DESIGN.md §4.3)."""

    @staticmethod
    def forward(ctx, c, k, w, v, eps, inj):
        out, t, stats, rinv, dsc = _forward(c, k, w, v, eps, inj, keep_t=True)
        ctx.save_for_backward(c, k, w, v, stats, rinv, dsc)
        ctx.inj, ctx.t = inj, t
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad):
        c, k, w, v, stats, rinv, dsc = ctx.saved_tensors
        t, ctx.t = ctx.t, None  # t becomes dC_k; a second backward recomputes it
        d_c, d_k, d_w, d_v = _backward(_rows(grad), c, k, w, v, ctx.inj, stats, rinv, dsc, t)
        return d_c, d_k, d_w, d_v, None, None


def forward_saving(c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor, eps: float,
                   inj: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """The forward without autograd and without t, for a caller that runs the backward itself (the lean
    recompute, docs/DESIGN.md §5.5): out and the statistics the backward needs besides the factors, each
    (G, ·) sized by m and e or one value per key: (stats, r, ds scale)."""
    c, k, v, w = _rows(c), _rows(k), _rows(v), _mat(w)
    out, _, stats, rinv, dsc = _forward(c, k, w, v, eps, inj, keep_t=False)
    return out, (stats, rinv, dsc)


def backward_saved(grad: torch.Tensor, c: torch.Tensor, k: torch.Tensor, w: torch.Tensor | None, v: torch.Tensor,
                   inj: bool, saved: tuple[torch.Tensor, ...]):
    """(dc, dk, dw or None, dv) of ``forward_saving`` from the same factors and its statistics (t recomputed)."""
    c, k, v, w = _rows(c), _rows(k), _rows(v), _mat(w)
    return _backward(_rows(grad), c, k, w, v, inj, *saved, None)


def normalize_cpu(c: torch.Tensor, k: torch.Tensor, v: torch.Tensor, norm: str, eps: float,
                  w: torch.Tensor | None, alpha: float | None = None) -> torch.Tensor:
    """(G, Nq, m), (G, Nk, m), (G, Nk, e), w (G, m, m) or None -> (G, Nq, e), autograd when needed.

    ``alpha``: the output scale of docs/DESIGN.md §4.6 applied in the pass, v̄ + alpha (Z V − v̄) (the packed
    M scaled), for calls that need no gradient (ValueError naming ``alpha`` otherwise)."""
    c, k, v, w = _rows(c), _rows(k), _rows(v), _mat(w)
    inj = norm == "injective"
    tensors = (c, k, v) if w is None else (c, k, v, w)
    if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        if alpha is not None:
            raise ValueError("alpha: the scale in the C pass serves calls without a gradient only")
        return NormalizationCPU.apply(c, k, w, v, float(eps), inj)
    return _forward(c, k, w, v, eps, inj, keep_t=False, alpha=1.0 if alpha is None else alpha)[0]
