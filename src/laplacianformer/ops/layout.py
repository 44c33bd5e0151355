"""Memory-layout helper shared by the CPU fast paths."""

from __future__ import annotations

import torch


def last_dim_contiguous(t: torch.Tensor) -> torch.Tensor:
    """t itself when its last dimension is contiguous (any other strides: the C loops and the batched
    products read rows in place, e.g. q = qk[..., :d] of a wider projection or the heads of a (B, N, H·e)
    tensor), else a contiguous copy."""
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()
