"""Convolutions on token grids in channels-last layout (no NCHW round trip).

Tokens (B, N, C) in row-major grid order are already a channels-last (B, C, h, w) tensor. PyTorch's CPU
convolution (oneDNN) picks its memory format from the input *and* the weight, so with the default NCHW
weight it copies the input to NCHW and the output back: for a 3×3 depthwise conv on a 128×128×64 grid
those copies cost about 25 times the convolution itself. With a channels-last weight the whole call
stays channels-last. The weight is restrided with ``Tensor.to(memory_format=...)`` (a small
differentiable copy): ``contiguous(memory_format=...)`` leaves a depthwise (C, 1, k, k) weight as it is,
since it counts as contiguous in both formats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


def conv2d_channels_last(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` computed in channels-last layout.  x: (B, C_in, H, W) -> (B, C_out, H', W') channels-last."""
    weight = conv.weight.to(memory_format=torch.channels_last)
    if conv.padding_mode != "zeros":
        return conv._conv_forward(x, weight, conv.bias)
    return F.conv2d(x, weight, conv.bias, conv.stride, conv.padding, conv.dilation, conv.groups)


def tokens_to_grid(x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """(B, N, C) tokens -> (B, C, h, w) view with channels-last strides (a copy only for strided tokens)."""
    b, n, c = x.shape
    return x.contiguous().transpose(1, 2).reshape(b, c, hw[0], hw[1])


def grid_to_tokens(x: torch.Tensor) -> torch.Tensor:
    """(B, C, h, w) -> (B, h·w, C) tokens; a view for a channels-last x."""
    return x.flatten(2).transpose(1, 2)


def conv_tokens(conv: nn.Conv2d, x: torch.Tensor, hw: tuple[int, int]) -> torch.Tensor:
    """A 2-D convolution of a token grid.  x: (B, N, C_in), hw = (h, w), h·w = N -> (B, N', C_out)."""
    return grid_to_tokens(conv2d_channels_last(conv, tokens_to_grid(x, hw)))
