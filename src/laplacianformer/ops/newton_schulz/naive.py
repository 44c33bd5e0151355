"""Newton–Schulz pseudo-inverse, plain PyTorch: the reference of the solver (docs/DESIGN.md §3).

P = W + eps·I, V0 = alpha·P with alpha = 1.8 / (max_i sum_j |P_ij|)^2 computed per matrix, then
V <- 2V - V P V.  For symmetric P, sigma_max(P) <= max row sum, so alpha < 2 / sigma_max^2 and the
iteration converges; for a non-symmetric P we start from alpha·P^T with alpha = 1.8 / (||P||_1 ||P||_inf).

``newton_schulz_iterate_reference`` is the torch loop (differentiable), the reference backend "torch" of
the dispatched ``newton_schulz_iterate`` in ``__init__.py``.
"""

from __future__ import annotations

import functools

import torch

from .. import _runtime


def _scaled_eye(m: int, eps: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """eps·I (m, m); made outside inference mode so that autograd may save it later."""
    with torch.inference_mode(False), torch.no_grad():
        return torch.eye(m, dtype=dtype, device=device).mul_(eps)


_cached_scaled_eye = functools.lru_cache(maxsize=32)(_scaled_eye)


def regularise(w: torch.Tensor, eps: float) -> torch.Tensor:
    """P = W + eps·I.  w: (..., m, m).  eps·I is cached in eager mode (one add per call instead of three
    launches on a GPU); made afresh while a graph is traced or captured (``_runtime.capturing``)."""
    if eps == 0:
        return w
    args = (w.shape[-1], float(eps), w.dtype, w.device)
    return w + (_scaled_eye(*args) if _runtime.capturing(modes=False) else _cached_scaled_eye(*args))


def initial_guess(p: torch.Tensor, symmetric: bool = True) -> torch.Tensor:
    """V0 = alpha·P (symmetric) or alpha·P^T, alpha per matrix.  p: (..., m, m)."""
    absp = p.abs()
    row = absp.sum(-1).amax(-1)
    if symmetric:
        alpha = 1.8 / row.pow(2)
        return alpha[..., None, None] * p
    col = absp.sum(-2).amax(-1)
    alpha = 1.8 / (row * col)
    return alpha[..., None, None] * p.transpose(-1, -2)


def pinv_residual(p: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """||I - P V||_F per matrix.  p, v: (..., m, m) -> (...)."""
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    return torch.linalg.matrix_norm(eye - p @ v)


CHECK_EVERY = 5
"""Steps between residual checks of the torch loop and the C loop (each check costs a few small ops)."""


def newton_schulz_iterate_reference(
    p: torch.Tensor, iters: int, tol: float | None = None, symmetric: bool = True
) -> torch.Tensor:
    """V ≈ P^{-1} by `iters` steps of V <- 2V - V (P V), in torch (differentiable).  p: (..., m, m) -> (..., m, m).

    One step is two batched products (``baddbmm`` for 2V - V·PV, ``bmm`` for the next P V).  Every
    ``CHECK_EVERY`` steps and after the last one the residual ||I - P V||_F is measured; it stops early
    once every matrix is within ``tol``.
    Safeguard: the residual R = I - P V obeys R_{k+1} = R_k², so ||R||_F never grows in exact arithmetic.
    A matrix whose residual at a check is larger than at its best earlier check, or not finite (rounding
    taking over, e.g. float32 with cond(P) > 1e7 and eps = 0), keeps that best iterate, so the result
    stays finite.
    """
    shape = p.shape
    m = shape[-1]
    p3 = p.reshape(-1, m, m)
    v = initial_guess(p3, symmetric)
    eye = torch.eye(m, dtype=p.dtype, device=p.device)
    pv = torch.bmm(p3, v)
    best_v = v
    best_res = torch.linalg.matrix_norm(eye - pv)
    for step in range(iters):
        v = torch.baddbmm(v, v, pv, beta=2.0, alpha=-1.0)
        pv = torch.bmm(p3, v)
        if (step + 1) % CHECK_EVERY and step + 1 < iters:
            continue
        res = torch.linalg.matrix_norm(eye - pv)
        better = res <= best_res
        best_v = torch.where(better[:, None, None], v, best_v)
        best_res = torch.where(better, res, best_res)
        if tol is not None and bool((best_res <= tol).all()):
            break
    return best_v.reshape(shape)


def newton_schulz_pinv_unrolled(w: torch.Tensor, iters: int = 20, eps: float = 0.01, symmetric: bool = True) -> torch.Tensor:
    """Reference with autograd through every iteration (the 'unrolled' backward option): the torch loop."""
    return newton_schulz_iterate_reference(regularise(w, eps), iters, None, symmetric)
