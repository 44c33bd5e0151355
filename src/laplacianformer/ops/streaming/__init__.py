"""The op ``streaming``: the Nyström output of the core in three fused passes over the rows (docs/KERNELS.md,
"The streaming passes"; the formulas are docs/DESIGN.md §4.3–§4.4 with the masking of §2.5).

    streaming_nystrom(qs, ks, vv, marks, w_inv, settings, mask, conv) -> (B, H, N, e), or None

is asked by ``ops/nystrom.py``'s ``nystrom()`` once W and W⁺ are known: instead of C_k = k(K, L),
C_q = k(Q, L) and the normalisation as separate ops (about 30 launches on a GPU), the passes recompute the
kernel rows from q, k and the landmarks and never store them (3 launches). Backends, in the order "auto"
tries them:

- ``triton`` (``triton.py``): CUDA tensors (or ``TRITON_INTERPRET=1`` when forced), forward only;
- ``torch`` (``reference.py``): the same passes in plain PyTorch, the kernels' test specification; never
  chosen automatically (the step path is faster on the CPU), forced for tests;
- ``steps`` (the reference of the op): returns None, and the caller runs its step path (the dispatched
  ops ``kernel``, ``normalization``), which serves everything.

A call that may need a gradient never reaches the registry (``streaming_nystrom`` returns None: the step
path has the backward). What the pass backends serve is declared (``limits.PASSES``, ``limits.TRITON_PASSES``,
docs/DESIGN.md §6.3): the shipped norms (the ablation norms "rowsum", "none", "injective_nomean" run the step
path), m <= 64, d, e <= 128, and (``triton``) CUDA tensors in float32, float16 or bfloat16
(``limits.LOAD_DTYPES``: half q, k, v are read as they are, summed in float32, the output written in v's
dtype; ``torch`` computes the same in float32) of a family with a Triton profile. Both refuse graph tracing
or a dispatch mode (which must see the ops); they serve CUDA-graph stream capture (the passes make no
host synchronisation). The output includes the settings' output scale of §4.6 (``norm_scale``: the
whitened part times α = n^-p, n each sequence's valid keys, computed on the device); a learned gain is the
caller's post-op (``nystrom`` does not ask the op then).

``conv`` (an ``ops.value_conv.ValueConv``, or None): the layer's DWConv(V) (docs/DESIGN.md §4.5), which the
output pass then adds to each tile it writes, so the result is "heads + DWConv(V)" (the Triton output a view
of the (B, N, C) sum: the layer's weight copy, conv and add are no launches of their own). Given only by
``attention_core`` for an inference call with nothing after the Nyström output (no §4.6 scale, no dtype
cast, no padding, no prefix tokens); both pass backends refuse a conv they cannot fuse (``limits.conv_unfit``:
V not the head view of the conv's tokens, a mask, a weight that is not a 3×3 depthwise one of the H·e
channels; ``triton`` also a weight that is not float32), and then the whole call runs the step path, after
which ``nystrom()`` adds the conv as the layer does.

``landmarks.py`` holds the op before the passes, ``landmark_solve``: the landmarks, W and W⁺ in one launch
(``attention_core`` asks it; docs/KERNELS.md, "The fused landmark solve").
"""

from __future__ import annotations

import torch

from ..capabilities import Call, triton_missing, unserved
from ..settings import AttentionSettings
from .gates import eager_only, float32_of, fused_op, needs_grad as _needs_grad, triton_device
from .limits import PASSES, STREAMED_NORMS, TRITON_PASSES, conv_unfit, scale_power
from .reference import streaming_nystrom_reference

__all__ = ["STREAMING", "STREAMED_NORMS", "streaming_nystrom", "streaming_nystrom_reference", "triton_device"]


def streaming_nystrom(qs: torch.Tensor, ks: torch.Tensor, vv: torch.Tensor, marks: torch.Tensor,
                      w_inv: torch.Tensor, s: AttentionSettings, mask: torch.Tensor | None = None, conv=None):
    """Z(C_q W⁺ C_kᵀ) V (norm "none": C_q W⁺ C_kᵀ V) with the output scale of ``s.norm_scale`` (§4.6), plus
    DWConv(V) with ``conv``, by the selected backend, or None for the step path (which neither scales nor adds
    the conv).

    qs, ks (B, H, N, d) (``ks is qs`` when K = Q), vv (B, H, N, e): the core's padded factors (the compute
    dtype, or half inputs as they are when no mask pads them); marks (B, H, m, d); w_inv (B, H, m, m); mask (B, N) bool (True = padding) or None; conv an
    ``ops.value_conv.ValueConv`` whose tokens are vv in token layout (B, N, H·e), or None.

    A call that may need a gradient returns None without asking the registry: the op is forward-only, so
    such a call is no call of the op (as an exact-kernel call is none), whatever backend is forced. So does
    a call while torch.compile traces (the graph holds the step path's custom ops, docs/DESIGN.md §6.5)."""
    if torch.compiler.is_compiling() or _needs_grad(qs, ks, vv, marks, w_inv, *_conv_tensors(conv)):
        return None  # torch.compile traces the step ops (their custom ops), never this registry's Python
    return STREAMING(qs, ks, vv, marks, w_inv, s, mask, conv)


def _conv_tensors(conv) -> tuple:
    return () if conv is None else tuple(t for t in (conv.weight, conv.bias) if t is not None)


def _call(qs, ks, vv, marks, w_inv, s, mask, conv=None) -> Call:
    """The op's arguments as the ``Call`` its backends' declarations are checked against: q, k, v read in one
    dtype; the landmarks, W⁺, the mask and the conv's parameters (dtypes of their own) checked for their device
    and gradient."""
    return Call((qs, ks, vv), kernel=s.kernel, norm=s.norm, m=marks.shape[-2], d=qs.shape[-1], e=vv.shape[-1],
                masked=mask is not None,
                aux=(marks, w_inv) + (() if mask is None else (mask,)) + _conv_tensors(conv))


def _conv_refusal(dtype, qs, ks, vv, marks, w_inv, s, mask, conv=None) -> str | None:
    """A conv the output pass cannot fuse (``limits.conv_unfit``; given ``dtype``, the Triton kernel's)."""
    why = None if conv is None else conv_unfit(conv, vv, mask, dtype)
    return None if why is None else f"DWConv(V) not fused: {why}"


def _pass_refusal(*inputs) -> str | None:
    return eager_only(PASSES.what) or unserved(PASSES, _call(*inputs)) or _conv_refusal(None, *inputs)


def _triton_refusal(*inputs) -> str | None:
    call = _call(*inputs)
    return (eager_only(PASSES.what) or unserved(TRITON_PASSES, call) or _conv_refusal(call.tensors[0].dtype, *inputs)
            or triton_missing())


def _triton(qs, ks, vv, marks, w_inv, s, mask, conv=None):
    from .triton import streaming_triton

    return streaming_triton(qs, ks, vv, marks, w_inv, s.bandwidth, s.kernel, s.norm, s.norm_eps, mask, conv,
                            scale_power=scale_power(s.norm, s.norm_scale))


def _torch(qs, ks, vv, marks, w_inv, s, mask, conv=None):
    out_dtype = vv.dtype
    qs, ks, vv = float32_of(qs, ks, vv)  # the Triton passes' half reads: the same values, summed in float32
    out = streaming_nystrom_reference(qs, ks, vv, marks.to(qs.dtype), w_inv.to(qs.dtype), s.bandwidth, s.kernel,
                                      s.norm, s.norm_eps, mask, conv,
                                      scale_power(s.norm, s.norm_scale))
    return out.to(out_dtype)


STREAMING = fused_op(
    "streaming", (_triton, _triton_refusal), (_torch, _pass_refusal),
    "the passes' PyTorch specification, for tests: the step path is faster where Triton does not run",
    signature="streaming_nystrom(qs, ks, vv, marks, w_inv, settings, mask[, conv]): qs, ks (B, H, N, d), "
              "vv (B, H, N, e), conv a ValueConv or None; None from 'steps' = run the step path")
