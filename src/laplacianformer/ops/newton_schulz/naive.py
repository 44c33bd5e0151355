"""Newton–Schulz pseudo-inverse, plain PyTorch (SPEC.md §3).

P = W + eps·I, V0 = alpha·P with alpha = 1.8 / (max_i sum_j |P_ij|)^2 computed per matrix, then
V <- 2V - V P V.  For symmetric P, sigma_max(P) <= max row sum, so alpha < 2 / sigma_max^2 and the
iteration converges; for a non-symmetric P we start from alpha·P^T with alpha = 1.8 / (||P||_1 ||P||_inf).
"""

from __future__ import annotations

import torch


def regularise(w: torch.Tensor, eps: float) -> torch.Tensor:
    """P = W + eps·I.  w: (..., m, m)."""
    if eps == 0:
        return w
    eye = torch.eye(w.shape[-1], dtype=w.dtype, device=w.device)
    return w + eps * eye


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


def newton_schulz_iterate(
    p: torch.Tensor, iters: int, tol: float | None = None, symmetric: bool = True
) -> torch.Tensor:
    """V ≈ P^{-1} by `iters` steps of V <- 2V - V P V (stops early once ||I - P V||_F <= tol for every matrix).

    Safeguard: the residual R = I - P V obeys R_{k+1} = R_k², so ||R||_F never grows in exact arithmetic.
    A matrix whose residual grows or turns non-finite (rounding taking over, e.g. float32 with
    cond(P) > 1e7 and eps = 0) keeps its previous iterate, so the result stays finite.
    """
    v = initial_guess(p, symmetric)
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device)
    pv = p @ v
    res = torch.linalg.matrix_norm(eye - pv)
    for step in range(iters):
        v_next = 2 * v - v @ pv
        pv_next = p @ v_next
        res_next = torch.linalg.matrix_norm(eye - pv_next)
        better = (res_next <= res).unsqueeze(-1).unsqueeze(-1)
        v = torch.where(better, v_next, v)
        pv = torch.where(better, pv_next, pv)
        res = torch.minimum(res, res_next.nan_to_num(nan=float("inf")))
        if tol is not None and (step + 1) % 5 == 0 and bool((res <= tol).all()):
            break
    return v


def newton_schulz_pinv_unrolled(w: torch.Tensor, iters: int = 20, eps: float = 0.01, symmetric: bool = True) -> torch.Tensor:
    """Reference with autograd through every iteration (the 'unrolled' backward option)."""
    return newton_schulz_iterate(regularise(w, eps), iters, None, symmetric)
