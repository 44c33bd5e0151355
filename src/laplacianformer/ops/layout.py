"""Memory-layout helpers shared by the fast paths (docs/DESIGN.md §6)."""

from __future__ import annotations

import torch


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dimension is contiguous (any other strides: the C loops and the batched
    products read rows in place, e.g. q = qk[..., :d] of a wider projection or the heads of a (B, N, H·e)
    tensor), else a contiguous copy."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def flatten_batch(t: torch.Tensor) -> torch.Tensor:
    """(..., R, C) -> contiguous (B, R, C), B the product of the leading dimensions (the Triton layout)."""
    return t.reshape(-1, t.shape[-2], t.shape[-1]).contiguous()
