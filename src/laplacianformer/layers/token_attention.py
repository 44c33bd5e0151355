"""Shared nn.Module shell of every attention layer: the (x: (B, N, C), hw) interface.

    q, k, v = split_heads(Linear(x))        (k = q when ``tie_qk``)
    out = proj( attend(q, k, v, hw) [+ DWConv3x3(V) when ``dwconv``] )
The q/k and v products are computed separately (row slices of one weight) so that v stays contiguous in
token layout and the heads are merged by adding them into DWConv(V), without extra copies.
Subclasses (``LaplacianAttention`` and the baselines) implement ``attend`` on (B, H, N, d) tensors with
their functional op, so a model or a benchmark can swap any of them for another.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..ops.validation import check_head_split, check_hw
from .grid_conv import conv_tokens


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

    def _project(self, x: torch.Tensor):
        """x (B, N, C) -> q, k (B, H, N, d) views of one (B, N, 2C) product (k = q when ``tie_qk``) and the
        values v_tok (B, N, C), contiguous.

        Two products with row slices of the one ``qkv`` weight (same parameters as a single (3C) product):
        v then needs no copy for the depthwise conv (a channels-last view of v_tok) and q, k are read in
        place by the CPU kernels."""
        b, n, _ = x.shape
        rows = self.dim * (1 if self.tie_qk else 2)
        weight, bias = self.qkv.weight, self.qkv.bias
        qk = F.linear(x, weight[:rows], None if bias is None else bias[:rows])
        v_tok = F.linear(x, weight[rows:], None if bias is None else bias[rows:])
        parts = qk.view(b, n, -1, self.num_heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q = parts[0]
        k = q if self.tie_qk else parts[1]
        return q, k, v_tok

    def _value_conv(self, v_tok: torch.Tensor, hw: tuple[int, int] | None) -> torch.Tensor:
        """DWConv(V): v_tok (B, N, C) -> (B, N, C), 3×3 depthwise on the grid (1-D: kernel 3 along N).

        The grid is a channels-last view of the tokens, so the convolution reads and writes token layout."""
        b, n, c = v_tok.shape
        if hw is None:
            weight = self.dwconv.weight[:, :, 1:2, :]
            y = F.conv2d(v_tok.transpose(1, 2).unsqueeze(2), weight, self.dwconv.bias, padding=(0, 1), groups=c)
            return y.squeeze(2).transpose(1, 2)
        return conv_tokens(self.dwconv, v_tok, hw)

    def forward(self, x: torch.Tensor, hw: tuple[int, int] | None = None) -> torch.Tensor:
        """x: (B, N, C), hw: (height, width) with height·width = N, or None (1-D) -> (B, N, C)."""
        if x.dim() != 3 or x.shape[-1] != self.dim:
            raise ValueError(f"x: expected (B, N, {self.dim}) tokens, got shape {tuple(x.shape)}")
        b, n, c = x.shape
        if hw is not None:
            hw = check_hw((int(hw[0]), int(hw[1])), n)
        q, k, v_tok = self._project(x)
        v = v_tok.view(b, n, self.num_heads, self.head_dim).transpose(1, 2)
        heads = self.attend(q, k, v, hw)
        if self.dwconv is not None:
            # DWConv(V) in token layout, then the heads added into it: one pass merges the heads.
            out = self._value_conv(v_tok, hw)
            out.view(b, n, self.num_heads, self.head_dim).transpose(1, 2).add_(heads)
        else:
            out = heads.transpose(1, 2).reshape(b, n, c)
        return self.proj_drop(self.proj(self.attn_drop(out)))
