"""Shared nn.Module shell of every attention layer: the (x: (B, N, C), hw) interface.

    q, k, v = split_heads(Linear(x))        (k = q when ``tie_qk``)
    out = proj( attend(q, k, v, hw) [+ DWConv3x3(V) when ``dwconv``] )
Subclasses (``LaplacianAttention`` and the baselines) implement ``attend`` on (B, H, N, d) tensors with
their functional op, so a model or a benchmark can swap any of them for another.
"""

from __future__ import annotations

import torch
from torch import nn

from ..ops.validation import check_head_split, check_hw


class TokenAttention(nn.Module):
    """Multi-head attention shell: projections, head split, dropout, output projection.

    Args:
        dim: channels C (divisible by num_heads); num_heads: heads H, head dim d = C / H.
        qkv_bias: bias of the q/k/v projection; tie_qk: K = Q (no key projection).
        dwconv: add a 3×3 depthwise conv of V on the token grid (1-D: kernel 3) to the attention output.
        attn_drop: dropout on the attention output before the projection; proj_drop: after it.
    """

    def __init__(
        self,
        dim: int,
        num_heads: int = 8,
        *,
        qkv_bias: bool = True,
        tie_qk: bool = False,
        dwconv: bool = False,
        attn_drop: float = 0.0,
        proj_drop: float = 0.0,
    ) -> None:
        super().__init__()
        check_head_split(dim, num_heads)
        self.dim = dim
        self.num_heads = num_heads
        self.head_dim = dim // num_heads
        self.tie_qk = tie_qk
        self.qkv = nn.Linear(dim, dim * (2 if tie_qk else 3), bias=qkv_bias)
        self.dwconv = nn.Conv2d(dim, dim, 3, padding=1, groups=dim) if dwconv else None
        self.attn_drop = nn.Dropout(attn_drop)
        self.proj = nn.Linear(dim, dim)
        self.proj_drop = nn.Dropout(proj_drop)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, hw) -> torch.Tensor:
        """q, k, v: (B, H, N, d) -> (B, H, N, d)."""
        raise NotImplementedError

    def _value_conv(self, v: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
        """DWConv(V): v (B, H, N, d) -> (B, H, N, d), 3×3 depthwise on the grid (1-D: kernel 3 along N)."""
        b, h, n, d = v.shape
        x = v.transpose(1, 2).reshape(b, n, h * d).transpose(1, 2)
        if hw is None:
            weight = self.dwconv.weight[:, :, 1:2, :]
            y = nn.functional.conv2d(x.unsqueeze(2), weight, self.dwconv.bias, padding=(0, 1), groups=h * d).squeeze(2)
        else:
            y = self.dwconv(x.reshape(b, h * d, hw[0], hw[1])).flatten(2)
        return y.transpose(1, 2).reshape(b, n, h, d).transpose(1, 2)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """x: (B, N, C), hw: (height, width) with height·width = N, or None (1-D) -> (B, N, C)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected (B, N, {self.dim}) tokens, got shape {tuple(x.shape)}")
        b, n, c = x.shape
        if hw is not None:
            hw = check_hw((int(hw[0]), int(hw[1])), n)
        parts = self.qkv(x).reshape(b, n, -1, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        if self.tie_qk:
            q, v = parts.unbind(0)
            k = q
        else:
            q, k, v = parts.unbind(0)
        out = self.attend(q, k, v, hw)
        if self.dwconv is not None:
            out = out + self._value_conv(v, hw)
        out = self.attn_drop(out).transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(out))
