"""SOFT: softmax-free attention (Lu et al. 2021, "SOFT: Softmax-free Transformer with Linear Complexity").

A Gaussian kernel with keys tied to queries, no row normalisation, Nyström-approximated:
    S_ij = exp(-||q_i - q_j||² / (2·sqrt(d)))          (the SOFT bandwidth)
    out  = C (W + eps·I)^{-1} Cᵀ V,  C = k(Q, L) (N×m),  W = k(L, L) (m×m),  L = pooled queries
This is ``laplacian_attention(q, q, v, kernel="gaussian", norm="none", qk_scale=1, lam=2·sqrt(d))``: the
same landmark pooling (adaptive average to a fixed grid, DESIGN.md §2) and Newton–Schulz solver (DESIGN.md §3)
as ours, so the only differences from LaplacianFormer are the kernel and the normalisation. SOFT's own
landmarks are learned by a strided conv + norm; ours are pooled to a fixed m at any resolution (DESIGN.md §2).
"""

from __future__ import annotations

import torch

from ..ops.attention import laplacian_attention
from ..ops.validation import check_landmarks, check_qkv, resolve_landmarks
from ..layers.token_attention import TokenAttention

__all__ = ["soft_bandwidth", "soft_attention", "soft_attention_dense", "SoftAttention"]


def soft_bandwidth(head_dim: int) -> float:
    """SOFT's lambda for exp(-||x - y||² / lambda): 2·sqrt(d)."""
    return 2.0 * head_dim**0.5


def soft_attention(
    q: torch.Tensor,
    v: torch.Tensor,
    *,
    hw: tuple[int, int] | None = None,
    landmarks=(7, 7),
    solver: str = "newton_schulz",
    iters: int = 20,
    ns_eps: float = 0.01,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """SOFT attention, keys tied to queries.  q: (B, H, N, d), v: (B, H, N, d_v) -> (B, H, N, d_v).

    hw, landmarks, solver, iters, ns_eps, key_padding_mask ((B, N) bool, True = padding): as in
    ``laplacian_attention`` (landmarks=None: exact O(N²) kernel; masks: docs/DESIGN.md §2.5).
    """
    check_qkv(q, q, v)
    return laplacian_attention(
        q,
        q,
        v,
        hw=hw,
        landmarks=landmarks,
        lam=soft_bandwidth(q.shape[-1]),
        qk_scale=1.0,
        norm="none",
        solver=solver,
        iters=iters,
        ns_eps=ns_eps,
        kernel="gaussian",
        key_padding_mask=key_padding_mask,
    )


def soft_attention_dense(q: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """Dense definition: materialises S_ij = exp(-||q_i - q_j||² / (2 sqrt d)) (B, H, N, N), returns S V."""
    check_qkv(q, q, v)
    sq = (q.unsqueeze(-2) - q.unsqueeze(-3)).pow(2).sum(-1)
    return torch.exp(-sq / soft_bandwidth(q.shape[-1])) @ v


class SoftAttention(TokenAttention):
    """Multi-head SOFT attention with the ``LaplacianAttention`` interface: forward(x, hw).

    Keys are tied to queries (the projection makes only q and v). Args: dim, num_heads, qkv_bias,
    attn_drop, proj_drop as in ``TokenAttention``; landmarks (default 7×7, clamped to the token grid;
    exact kernel when it covers every token), solver, iters, ns_eps as in ``soft_attention``.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        landmarks=(7, 7),
        solver: str = "newton_schulz",
        iters: int = 20,
        ns_eps: float = 0.01,
        **kwargs,
    ) -> None:
        super().__init__(dim, num_heads, tie_qk=True, **kwargs)
        self.landmarks = check_landmarks(landmarks)
        self.solver_kwargs = dict(solver=solver, iters=iters, ns_eps=ns_eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, {self.solver_kwargs}"

    def attend(self, q, k, v, hw, key_padding_mask=None):
        grid = resolve_landmarks(self.landmarks, hw, q.shape[2], clamp=True)
        return soft_attention(q, v, hw=hw, landmarks=grid, key_padding_mask=key_padding_mask, **self.solver_kwargs)
