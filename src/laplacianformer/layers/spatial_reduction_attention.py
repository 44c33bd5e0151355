"""PVTv2's spatial-reduction softmax attention: the quadratic baseline token mixer (docs/DESIGN.md §5)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.validation import check_head_split
from .grid_conv import GridConv2d, grid_to_tokens, tokens_to_grid
from .tracing import notrace

__all__ = ["SpatialReductionAttention"]


@notrace
def pad_to_cell(grid: torch.Tensor, size: int) -> torch.Tensor:
    """Zero-pad a (B, C, h, w) grid at the bottom/right to at least ``size`` × ``size``.

    An FX leaf (the padding depends on the traced grid size); plain TorchScript otherwise."""
    pad_h, pad_w = max(0, size - grid.shape[2]), max(0, size - grid.shape[3])
    if pad_h > 0 or pad_w > 0:
        grid = F.pad(grid, (0, pad_w, 0, pad_h))
    return grid


torch.fx.wrap("pad_to_cell")


class SpatialReductionAttention(nn.Module):
    """Softmax attention whose keys/values come from a stride-``sr_ratio`` conv of the token map.

    x: (B, N, C), hw = (h, w) -> (B, N, C). Cost O(N · N / sr²). Grids smaller than ``sr_ratio`` are
    zero-padded up to one reduction cell so every input size works.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        sr_ratio: int = 1,
        qkv_bias: bool = True,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = check_head_split(dim, num_heads)
        self.sr_ratio = sr_ratio
        self.q = nn.Linear(dim, dim, bias=qkv_bias)
        self.kv = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        if sr_ratio > 1:
            self.sr = GridConv2d(dim, dim, sr_ratio, stride=sr_ratio)
            self.norm = nn.LayerNorm(dim)
        else:
            self.sr = None
            self.norm = None
        self.attn_drop = attn_drop
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def forward(self, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
        b, n, c = x.shape
        q = self.q(x).reshape(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        if self.sr is not None:
            grid = pad_to_cell(tokens_to_grid(x, hw), self.sr_ratio)
            x = self.norm(grid_to_tokens(self.sr(grid)))
        kv = self.kv(x).reshape(b, -1, 2, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        k, v = kv.unbind(0)
        out = F.scaled_dot_product_attention(q, k, v, dropout_p=self.attn_drop if self.training else 0.0)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(b, n, c)))
