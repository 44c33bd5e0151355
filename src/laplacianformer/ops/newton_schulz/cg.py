"""Batched conjugate-gradient inverse, the ablation baseline of DESIGN.md §3 (not a default path).

Solves P X = I column by column for symmetric positive definite P = W + eps·I.
"""

from __future__ import annotations

import torch


def conjugate_gradient_inverse(p: torch.Tensor, iters: int, tol: float | None = None) -> torch.Tensor:
    """X ≈ P^{-1} after `iters` CG steps on all m right-hand sides of P X = I at once.  p: (..., m, m)."""
    m = p.shape[-1]
    rhs = torch.eye(m, dtype=p.dtype, device=p.device).expand_as(p)
    x = torch.zeros_like(p)
    r = rhs.clone()
    d = r.clone()
    rs = (r * r).sum(-2, keepdim=True)
    tiny = torch.finfo(p.dtype).tiny
    for _ in range(iters):
        pd = p @ d
        alpha = rs / (d * pd).sum(-2, keepdim=True).clamp_min(tiny)
        x = x + alpha * d
        r = r - alpha * pd
        rs_new = (r * r).sum(-2, keepdim=True)
        if tol is not None and bool((rs_new.sum(-1).sqrt() <= tol).all()):
            break
        d = r + (rs_new / rs.clamp_min(tiny)) * d
        rs = rs_new
    return x
