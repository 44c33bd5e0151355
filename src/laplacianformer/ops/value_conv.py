"""DWConv(V), the value path of the attention layer (docs/DESIGN.md §4.5), as the ops see it.

    ValueConv(tokens, hw, weight, bias)        V (B, N, C) in token layout, the (gh, gw) grid or None (1-D),
                                               the depthwise weight (C, 1, 3, 3) and bias (C,) or None
    value_conv(conv) -> (B, N, C)              the 3×3 depthwise conv, zero padding, with bias, computed as
                                               the layer computes it (``layers/grid_conv.GridConv2d``: the
                                               grid a channels-last view of the tokens, the weight restrided
                                               channels-last; 1-D: its middle row, kernel 3 along N)
    add_value_conv(heads, conv) -> (B, H, N, e)  DWConv(V) + the heads merged: a view of the (B, N, C) sum
    value_conv_heads(vv, conv) -> (B, H, N, e)   the term the streaming output pass fuses, in pass form:
                                               DWConv of the V it reads, a 1-D sequence a (1, N) grid

The layer's inference call ``ops.attention.attention_with_value_conv`` hands the conv to the core so that the
streaming output pass (ops/streaming) can add it per tile instead of three launches (weight copy, conv, add;
docs/KERNELS.md, "The streaming passes"); wherever that does not serve, ``add_value_conv`` computes what the
layer's unfused path computes (the same aten calls in the same order, so the same bits). The ops do not
import the layers (docs/ARCHITECTURE.md): the weight and bias come as tensors.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from . import _runtime, grid_cpu

__all__ = ["ValueConv", "add_value_conv", "check_value_conv", "value_conv", "value_conv_heads"]


class ValueConv(NamedTuple):
    """The DWConv(V) term of one layer call: tokens (B, N, C) (the V whose head view (B, H, N, e) the core gets),
    hw (gh, gw) with gh·gw = N or None (a 1-D sequence), weight (C, 1, 3, 3), bias (C,) or None."""

    tokens: torch.Tensor
    hw: tuple[int, int] | None
    weight: torch.Tensor
    bias: torch.Tensor | None


def check_value_conv(tokens: torch.Tensor, hw, weight: torch.Tensor, bias: torch.Tensor | None) -> ValueConv:
    """The checked ``ValueConv``: tokens (B, N, C) floating, weight (C, 1, 3, 3) and bias (C,) of its dtype (any
    dtype under autocast) and device, hw already checked against N (``validation.check_hw``). ValueError / TypeError naming the argument."""
    if not isinstance(tokens, torch.Tensor) or not tokens.is_floating_point() or tokens.dim() != 3:
        got = tuple(tokens.shape) if isinstance(tokens, torch.Tensor) else type(tokens).__name__
        raise ValueError(f"v_tok: expected floating (B, N, C) tokens, got {got}")
    c = tokens.shape[-1]
    for name, t, shape in (("weight", weight, (c, 1, 3, 3)), ("bias", bias, (c,))):
        if t is None and name == "bias":
            continue
        if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
            got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
            raise ValueError(f"{name}: expected the depthwise 3×3 conv's {shape} for C = {c} channels, got {got}")
        # under autocast the tokens come from a lower-precision product and the conv casts its weight itself
        if t.device != tokens.device or (t.dtype != tokens.dtype
                                         and not torch.is_autocast_enabled(tokens.device.type)):
            raise TypeError(f"{name}: expected {tokens.dtype} on {tokens.device} (the tokens'), got {t.dtype} on "
                            f"{t.device}")
    return ValueConv(tokens, hw, weight, bias)


def value_conv(conv: ValueConv) -> torch.Tensor:
    """DWConv(V) (B, N, C) in token layout, by the aten calls of the layer's path (module docstring). A weight
    of another dtype than the tokens' (``check_value_conv`` allows it under autocast only) is cast to theirs,
    as autocast casts a conv's weight, so the result is the same inside a region that turned autocast off."""
    tokens, hw, weight, bias = conv
    if weight.dtype != tokens.dtype:
        weight, bias = weight.to(tokens.dtype), None if bias is None else bias.to(tokens.dtype)
    b, n, c = tokens.shape
    if hw is None:
        y = F.conv2d(tokens.transpose(1, 2).unsqueeze(2), weight[:, :, 1:2, :], bias, padding=(0, 1), groups=c)
        return y.squeeze(2).transpose(1, 2)
    grid = tokens.contiguous().transpose(1, 2).reshape(b, c, hw[0], hw[1])
    y = F.conv2d(grid, weight.to(memory_format=torch.channels_last), bias, padding=1, groups=c)
    return y.flatten(2).transpose(1, 2)


def add_value_conv(heads: torch.Tensor, conv: ValueConv) -> torch.Tensor:
    """DWConv(V) + heads (B, H, N, e) merged: a (B, H, N, e) view of the (B, N, C) sum. CPU inference in eager
    mode (no gradient, float32 / float64, the C library built) computes it in one C pass
    (``grid_cpu.dwconv_merge_cpu``, docs/DESIGN.md §6.6); elsewhere the heads are added into the conv's output
    in place (one pass merges them) unless autograd or a torch.jit trace must see an out-of-place add (the
    layer's rule, layers/token_attention.py)."""
    params = (conv.weight,) if conv.bias is None else (conv.weight, conv.bias)
    if grid_cpu.serves(heads, conv.tokens, *params) and not _runtime.capturing():
        return grid_cpu.dwconv_merge_cpu(heads, conv)
    out = value_conv(conv)
    b, n, c = out.shape
    h, e = heads.shape[1], heads.shape[3]
    if torch.jit.is_tracing() or (torch.is_grad_enabled() and (heads.requires_grad or out.requires_grad)):
        return (out + heads.transpose(1, 2).reshape(b, n, c)).view(b, n, h, e).transpose(1, 2)
    merged = out.view(b, n, h, e).transpose(1, 2)
    merged.add_(heads)
    return merged


def value_conv_heads(vv: torch.Tensor, conv: ValueConv) -> torch.Tensor:
    """The streaming output pass's conv term (its specification): DWConv of vv (B, H, N, e), the V the passes
    read, on the (gh, gw) grid (a 1-D sequence: the (1, N) grid, whose top and bottom weight rows meet the
    zero padding only), weight and bias in vv's dtype. Returns (B, H, N, e)."""
    b, h, n, e = vv.shape
    gh, gw = (1, n) if conv.hw is None else conv.hw
    grid = vv.permute(0, 1, 3, 2).reshape(b, h * e, gh, gw)
    bias = None if conv.bias is None else conv.bias.to(vv.dtype)
    y = F.conv2d(grid, conv.weight.to(vv.dtype), bias, padding=1, groups=h * e)
    return y.reshape(b, h, e, n).transpose(-1, -2)
