"""The rules the fused ops (``streaming``, ``landmark_solve``, ``fused_training``) share: their one table layout
(``fused_op``), that a call which may need a gradient is no call of the inference ones, and which devices their
Triton backends take."""

from __future__ import annotations

import torch

from .. import _runtime
from ..dispatch import Backend, Op

__all__ = ["cuda_only_auto_refusal", "eager_only", "float32_of", "fused_op", "needs_grad", "step_path",
           "triton_device"]


def eager_only(what: str) -> str | None:
    """What no declaration says, for every fused op: graph tracing or a dispatch mode (which must see the ops) is
    refused, CUDA-graph stream capture served (the fused kernels make no host synchronisation); ``what`` names
    the backend (its ``Serves.what``)."""
    why = _runtime.capture_reason(modes=True, streams=False)
    return None if why is None else f"{why} ({what} run eagerly only)"


def needs_grad(*tensors) -> bool:
    """Whether autograd would record a call on ``tensors`` (the fused ops are forward-only)."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors)


def triton_device(device: torch.device) -> bool:
    """Whether the Triton kernels take tensors on ``device``: CUDA, or the CPU under ``TRITON_INTERPRET=1``
    (the layer asks it before making strided q and k, which the kernels read through their row strides)."""
    return device.type == "cuda" or (device.type == "cpu" and _runtime.triton_interpreted())


def cuda_only_auto_refusal(qs, *_inputs) -> str | None:
    """The ``triton`` backends' rule under "auto": CUDA tensors only (the interpreter is for tests)."""
    if qs.device.type != "cuda":
        return "only chosen automatically for CUDA tensors (the interpreter is for tests)"
    return None


def step_path(*_inputs) -> None:
    """The ``steps`` backend of the fused ops (their reference): None, so the caller runs its step path."""
    return None


def float32_of(*tensors) -> list:
    """The torch backends' compute dtype for half inputs, as the Triton kernels read them: float16/bfloat16
    tensors in float32 (the same values), float32 and float64 as they are; a tensor given twice (K = Q) stays
    one tensor."""
    done = {}
    for t in tensors:
        if id(t) not in done:
            done[id(t)] = t.float() if t.dtype in (torch.float16, torch.bfloat16) else t
    return [done[id(t)] for t in tensors]


def fused_op(name: str, triton: tuple, spec: tuple, spec_note: str, signature: str) -> Op:
    """The registry of a fused op: ``triton`` (run, refusal), chosen automatically for CUDA tensors only; ``torch``
    = ``spec`` (run, refusal), the kernels' PyTorch specification, never chosen automatically (``spec_note``
    says why); ``steps``, the reference, which returns None: the caller runs its step path."""
    return Op(name, [
        Backend("triton", *triton, cuda_only_auto_refusal),
        Backend("torch", *spec, lambda *_inputs: spec_note),
        Backend("steps", step_path),
    ], signature=signature)
