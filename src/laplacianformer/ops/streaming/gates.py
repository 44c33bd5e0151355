"""The rules the fused inference ops (``streaming``, ``landmark_solve``) share for when they run: a call
that may need a gradient is no call of theirs, and which devices their Triton backends take."""

from __future__ import annotations

import torch

from .. import _runtime
from ..kernel.limits import TRITON_KERNEL_IDS

__all__ = ["cuda_only_auto_refusal", "float32_of", "kernel_unserved", "needs_grad", "step_path", "triton_device"]


def kernel_unserved(s) -> str | None:
    """Why the Triton kernels cannot compute the kernel family of settings ``s`` (no profile for its id), or
    None."""
    if s.spec.id not in TRITON_KERNEL_IDS:
        return f"kernel {s.kernel!r}: the Triton kernels have no profile for its id {s.spec.id}"
    return None


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
