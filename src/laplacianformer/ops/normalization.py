"""Normalisation of the similarity matrix and its product with V (SPEC.md §4).

Two implementations of each variant, which tests hold equal:
- ``normalize_dense(g, v, norm)``: the formula applied to a materialised (B, H, N, N) matrix ĝ;
- ``normalize_nystrom(c_q, b, v, norm)``: the same output from the Nyström factors ĝ = C_q Bᵀ with
  C_q (B, H, N, m) and B = C_k W⁺ᵀ (B, H, N, m), in O(N·m² + N·m·d) time and O(N·m) memory.

Injective variant, per image and head (Eq. 4 and 6 of the paper, with our choices of SPEC.md §4):
  h_ij = ĝ_ij - mean_j ĝ_ij,  mu_j = mean_i h_ij,  s_j² = var_i h_ij (population variance),
  z_ij = (h_ij - mu_j) / sqrt(s_j² + eps) + 1/N,  out_i = sum_j z_ij v_j.
"""

from __future__ import annotations

import torch


def normalize_dense(g: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6) -> torch.Tensor:
    """Z(ĝ) V for a materialised ĝ.  g: (B, H, N, N) queries × keys, v: (B, H, N, e) -> (B, H, N, e)."""
    n_keys = g.shape[-1]
    if norm == "none":
        z = g
    elif norm == "rowsum":
        z = g / g.sum(-1, keepdim=True)
    elif norm == "inline":
        z = g - g.mean(-1, keepdim=True) + 1.0 / n_keys
    elif norm == "injective":
        h = g - g.mean(-1, keepdim=True)
        mu = h.mean(-2, keepdim=True)
        var = h.var(-2, unbiased=False, keepdim=True)
        z = (h - mu) / torch.sqrt(var + eps) + 1.0 / n_keys
    else:
        raise ValueError(f"norm: expected one of ['injective', 'inline', 'rowsum', 'none'], got {norm!r}")
    return z @ v


def normalize_nystrom(
    c_q: torch.Tensor, b: torch.Tensor, v: torch.Tensor, norm: str, eps: float = 1e-6
) -> torch.Tensor:
    """Z(C_q Bᵀ) V without forming the N×N matrix.

    c_q: (B, H, N, m) query–landmark kernel; b: (B, H, N, m) with row j = W⁺ c_kj (key side);
    v: (B, H, N, e).  Returns (B, H, N, e).
    """
    n_keys = b.shape[-2]
    if norm == "none":
        return c_q @ (b.transpose(-1, -2) @ v)
    if norm == "rowsum":
        num = c_q @ (b.transpose(-1, -2) @ v)
        den = c_q @ b.sum(-2).unsqueeze(-1)
        return num / den
    v_mean = v.mean(-2, keepdim=True)
    b_centred = b - b.mean(-2, keepdim=True)
    if norm == "inline":
        return c_q @ (b_centred.transpose(-1, -2) @ v) + v_mean
    if norm == "injective":
        c_centred = c_q - c_q.mean(-2, keepdim=True)
        cov_q = c_centred.transpose(-1, -2) @ c_centred / c_q.shape[-2]
        var = ((b_centred @ cov_q) * b_centred).sum(-1).clamp_min(0.0)
        m_mat = (b_centred * torch.rsqrt(var + eps).unsqueeze(-1)).transpose(-1, -2) @ v
        return c_centred @ m_mat + v_mean
    raise ValueError(f"norm: expected one of ['injective', 'inline', 'rowsum', 'none'], got {norm!r}")
