"""Softmax attention (Vaswani et al. 2017), the quadratic baseline.

    out = softmax(Q Kᵀ · s) V,  s = d**-0.5 by default
``softmax_attention`` calls ``torch.nn.functional.scaled_dot_product_attention`` (PyTorch picks a flash,
memory-efficient or math backend); ``softmax_attention_naive`` materialises the N×N matrix and is the
dense definition the tests compare against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..ops.validation import check_key_padding_mask, check_positive, check_qkv
from ..layers.token_attention import TokenAttention

__all__ = ["softmax_attention", "softmax_attention_naive", "SoftmaxAttention"]


def _scale(q: torch.Tensor, scale: float | None) -> float:
    return q.shape[-1] ** -0.5 if scale is None else check_positive("scale", scale)


def softmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None,
    key_padding_mask: torch.Tensor | None = None,
) -> torch.Tensor:
    """softmax(Q Kᵀ · scale) V through SDPA.  q, k: (B, H, N, d); v: (B, H, N, d_v) -> (B, H, N, d_v).

    key_padding_mask: (B, N) bool, True = padding: padded keys are masked out, padded tokens read as 0
    (no gradient) and their output rows are 0 (docs/DESIGN.md §2.5)."""
    check_qkv(q, k, v)
    mask = check_key_padding_mask(key_padding_mask, q.shape[0], q.shape[2])
    if mask is None:
        return F.scaled_dot_product_attention(q, k, v, scale=_scale(q, scale))
    pad = mask[:, None, :, None]
    q, k, v = (t.masked_fill(pad, 0.0) for t in (q, k, v))
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=~mask[:, None, None, :], scale=_scale(q, scale))
    return out.masked_fill(pad, 0.0)


def softmax_attention_naive(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, scale: float | None = None
) -> torch.Tensor:
    """Dense definition: materialises softmax(Q Kᵀ · scale) (B, H, N, N), then multiplies by V."""
    check_qkv(q, k, v)
    return torch.softmax((q @ k.transpose(-1, -2)) * _scale(q, scale), dim=-1) @ v


class SoftmaxAttention(TokenAttention):
    """Multi-head softmax attention (SDPA) with the ``LaplacianAttention`` interface: forward(x, hw).

    Args: dim, num_heads, qkv_bias, attn_drop, proj_drop as in ``TokenAttention``;
    qk_scale: logit scale, None means d**-0.5.
    """

    def __init__(self, dim: int, num_heads: int = 8, *, qk_scale: float | None = None, **kwargs) -> None:
        super().__init__(dim, num_heads, **kwargs)
        self.qk_scale = None if qk_scale is None else check_positive("qk_scale", qk_scale)

    def attend(self, q, k, v, hw, key_padding_mask=None):
        return softmax_attention(q, k, v, scale=self.qk_scale, key_padding_mask=key_padding_mask)
