"""SOFT: softmax-free attention (Lu et al. 2021, "SOFT: Softmax-free Transformer with Linear Complexity").

A Gaussian kernel with keys tied to queries, no row normalisation, Nyström-approximated:
    S_ij = exp(-||q_i - q_j||² / (2·sqrt(d)))          (the SOFT bandwidth)
    out  = C (W + eps·I)^{-1} Cᵀ V,  C = k(Q, L) (N×m),  W = k(L, L) (m×m),  L = pooled queries
This is ``laplacian_attention(q, q, v, kernel="gaussian", norm="none", qk_scale=1, lam=2·sqrt(d))``: the
same landmark pooling (adaptive average to a fixed grid, DESIGN.md §2) and Newton–Schulz solver (DESIGN.md §3)
as ours, so the only differences from LaplacianFormer are the kernel and the normalisation. SOFT's own
landmarks are learned (a strided conv of stride sqrt(N/m), then LayerNorm and GELU), so their count is
fixed by the training resolution; ours are pooled to a fixed m at any resolution (DESIGN.md §2).
The module's value path is SOFT's: a 3×3 convolution of V with one filter per head, shared by the head's
d channels, without bias (1-D sequences: its middle row, kernel 3 along the sequence).
"""

from __future__ import annotations

import torch

import torch.nn.functional as F
from torch import nn

from ..ops.attention import default_bandwidth, laplacian_attention
from ..ops.validation import check_landmarks, check_qkv, resolve_landmarks
from ..layers.token_attention import TokenAttention

__all__ = ["soft_bandwidth", "soft_attention", "soft_attention_dense", "SoftAttention"]


def soft_bandwidth(head_dim: int) -> float:
    """SOFT's lambda for exp(-||x - y||² / lambda): 2·sqrt(d), the operator's Gaussian default (DESIGN.md §1.4)."""
    return default_bandwidth("gaussian", head_dim)[0]


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
        dwconv = kwargs.pop("dwconv", True)
        super().__init__(dim, num_heads, tie_qk=True, dwconv=False, **kwargs)
        # SOFT's value path: one 3×3 filter per head, shared by the head's channels, no bias
        self.dwconv = nn.Conv2d(num_heads, num_heads, 3, padding=1, groups=num_heads, bias=False) if dwconv else None
        self.landmarks = check_landmarks(landmarks)
        self.solver_kwargs = dict(solver=solver, iters=iters, ns_eps=ns_eps)

    def extra_repr(self) -> str:
        return f"dim={self.dim}, heads={self.num_heads}, landmarks={self.landmarks}, {self.solver_kwargs}"

    def _value_conv(self, v_tok: torch.Tensor, hw) -> torch.Tensor:
        """SOFT's DWConv(V): v_tok (B, N, C) -> (B, N, C), head h's filter on each of its d channels."""
        b, n, c = v_tok.shape
        weight = self.dwconv.weight.repeat_interleave(self.head_dim, dim=0)  # (C, 1, 3, 3), channel = h·d + i
        if hw is None:
            y = F.conv2d(v_tok.transpose(1, 2).unsqueeze(2), weight[:, :, 1:2, :], padding=(0, 1), groups=c)
            return y.squeeze(2).transpose(1, 2)
        grid = v_tok.transpose(1, 2).reshape(b, c, hw[0], hw[1])  # channels-last view of the tokens
        y = F.conv2d(grid, weight.to(memory_format=torch.channels_last), padding=1, groups=c)
        return y.flatten(2).transpose(1, 2)

    def attend(self, q, k, v, hw, key_padding_mask=None):
        grid = resolve_landmarks(self.landmarks, hw, q.shape[2])
        return soft_attention(q, v, hw=hw, landmarks=grid, key_padding_mask=key_padding_mask, **self.solver_kwargs)
