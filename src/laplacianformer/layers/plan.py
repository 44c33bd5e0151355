"""Which path one call of an attention layer takes (docs/DESIGN.md §5.7): a pure function of what the layer
can do and what the call is, tested on its own (tests/layers/test_layer_plan.py); ``TokenAttention.forward``
dispatches on its answer.

    path = layer_path(LayerTraits(...), CallKind(...))     # one of PATHS

- ``fused_training``: the core and DWConv(V) in the fused passes, forward and backward, from the one qkv
  product (``_attend_from_qkv``; CUDA, or the Triton interpreter);
- ``value_conv``: eager inference with the heads merged into DWConv(V) in one op call (``_attend_value_conv``:
  the streaming output pass on CUDA, the lean host path on the CPU, docs/DESIGN.md §6.6);
- ``recompute``: training with the core recomputed in the backward (§5.5);
- ``plain``: the operator on the heads, then DWConv(V) added (everything else: masks, prefix tokens, tracing,
  graphs, layers without these forms).
"""

from __future__ import annotations

from typing import NamedTuple

__all__ = ["PATHS", "CallKind", "LayerTraits", "layer_path"]

PATHS = ("fused_training", "value_conv", "recompute", "plain")


class LayerTraits(NamedTuple):
    """What a layer can do, fixed at construction: merges_value_conv / trains_from_qkv (its forms), dwconv (it
    has DWConv(V)), prefix (its num_prefix_tokens > 0), qk_norm, recompute."""

    merges_value_conv: bool
    trains_from_qkv: bool
    dwconv: bool
    prefix: bool
    qk_norm: bool
    recompute: bool


class CallKind(NamedTuple):
    """What one call is: masked (a key_padding_mask), grad_mode (autograd enabled), needs_grad (it records a
    graph: grad mode and an input or the projection's weight requires grad), traced (torch.jit tracing,
    torch.compile or torch.export: the unfused graph), fused_device (the Triton passes take its tensors)."""

    masked: bool
    grad_mode: bool
    needs_grad: bool
    traced: bool
    fused_device: bool


def layer_path(layer: LayerTraits, call: CallKind) -> str:
    """The path of ``PATHS`` this call takes (module docstring)."""
    plain_call = not call.masked and not layer.prefix and not call.traced
    if call.needs_grad:
        if (plain_call and layer.trains_from_qkv and call.fused_device and not layer.qk_norm
                and not layer.recompute):
            return "fused_training"
        return "recompute" if layer.recompute else "plain"
    if plain_call and not call.grad_mode and layer.merges_value_conv and layer.dwconv:
        return "value_conv"
    return "plain"
