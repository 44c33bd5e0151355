"""Convolutions on token grids in channels-last layout (no NCHW round trip).

Tokens (B, N, C) in row-major grid order are already a channels-last (B, C, h, w) tensor. PyTorch's CPU
convolution (oneDNN) picks its memory format from the input *and* the weight, so with the default NCHW
weight it copies the input to NCHW and the output back: for a 3×3 depthwise conv on a 128×128×64 grid
those copies cost about 25 times the convolution itself. With a channels-last weight the whole call
stays channels-last. The weight is restrided with ``Tensor.to(memory_format=...)`` (a small
differentiable copy): ``contiguous(memory_format=...)`` leaves a depthwise (C, 1, k, k) weight as it is,
since it counts as contiguous in both formats.

A depthwise weight (one input channel per group) is *stored* with channels-last strides, (k·k, 1, k, 1)
instead of (k·k, k·k, k, 1): the same bytes, contiguous in both formats, so state dicts and saved files do
not change. The restride is then no copy, and the convolution's channels-last weight gradient has the
parameter's own strides. A contiguous-strided depthwise parameter would get that gradient as it comes
(autograd's layout contract ignores the size-1 dimension), and DDP, whose bucket views take the parameter's
strides, would warn "Grad strides do not match bucket view strides" on every rank.

``GridConv2d`` is an ``nn.Conv2d`` (same parameters, state-dict keys and initialisation) whose forward does
this, so models and attention layers can be scripted and traced (a module passed to a free function
cannot be scripted); ``conv2d_channels_last`` / ``conv_tokens`` are the same computation for any
``nn.Conv2d`` in eager code.
"""

from __future__ import annotations

import torch
from torch import nn


__all__ = ["GridConv2d", "conv2d_channels_last", "conv_tokens", "grid_to_tokens", "tokens_to_grid"]


class GridConv2d(nn.Conv2d):
    """``nn.Conv2d`` computed in channels-last layout.  x: (B, C_in, H, W) -> (B, C_out, H', W') channels-last.

    Scriptable and traceable; the weight is restrided on each call, a depthwise weight stored restrided
    (see the module docstring)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        if self.weight.shape[1] == 1:  # depthwise: channels-last strides, same bytes (its gradient matches)
            self.weight = nn.Parameter(self.weight.detach().to(memory_format=torch.channels_last))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._conv_forward(x, self.weight.to(memory_format=torch.channels_last), self.bias)


def conv2d_channels_last(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``conv(x)`` computed in channels-last layout for any ``nn.Conv2d`` (eager code; modules that must
    script use ``GridConv2d``).  x: (B, C_in, H, W) -> (B, C_out, H', W') channels-last."""
    return conv._conv_forward(x, conv.weight.to(memory_format=torch.channels_last), conv.bias)


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
