"""What a backend serves, as data (docs/DESIGN.md §6.3), and the one function that turns it into refusals.

    CPU_NORM = Serves("the fused path", devices=("cpu",), dtypes=(torch.float32, torch.float64),
                      norms=SHIPPED_NORMS, masks=False)
    why = unserved(CPU_NORM, Call(tensors=(c, k, v), norm="injective", masked=False))   # None: it serves

A backend of an op's registry (``ops/dispatch.py``) declares a ``Serves``: the devices, dtypes, kernel families
(``KernelSpec.id``), norms, largest sizes, masks and gradients it takes. Each op turns its own arguments into
one ``Call`` record (the only place that reads them by position) and ``unserved`` derives the reason a
backend refuses, in the same words for every op; what no declaration can say (a C library that failed to
build, Triton missing, a CUDA graph being captured) stays a small function of the backend.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from . import _runtime
from .kernel_families import kernel_spec

__all__ = ["Call", "Serves", "not_exportable", "triton_missing", "unserved"]


@dataclass(frozen=True)
class Serves:
    """What one backend serves; None (or True) means anything.

    what: how refusals name it ("the fused path", "the Triton kernels"); devices: tensor device types
    (``interpreted``: CPU tensors too under TRITON_INTERPRET=1); dtypes; kernels: family ids; norms, solvers
    and ns_backwards (the variant lists of ``validation``), with ``form`` naming the backend's form of them in
    refusals; max_m / max_d / max_e: largest landmark count, head dim and value dim, with ``limit_note``
    saying why; masks: takes a key_padding_mask; grad: may run under autograd."""

    what: str
    devices: tuple[str, ...] | None = None
    interpreted: bool = False
    dtypes: tuple[torch.dtype, ...] | None = None
    kernels: frozenset[int] | None = None
    norms: tuple[str, ...] | None = None
    solvers: tuple[str, ...] | None = None
    ns_backwards: tuple[str, ...] | None = None
    form: str = "fused"
    max_m: int | None = None
    max_d: int | None = None
    max_e: int | None = None
    limit_note: str = ""
    masks: bool = True
    grad: bool = True


class Call(NamedTuple):
    """One call as its op's backends see it: the tensors (devices, one dtype, requires_grad), the kernel
    family's name, the norm, solver and Newton–Schulz backward, the sizes m (landmarks), d (head dim), e
    (value dim), whether a mask pads it, and ``aux``: other tensors of the call (a mask, weights, statistics in
    a dtype of their own), checked for their device and requires_grad but not their dtype. None: the call has
    no such argument (nothing to check)."""

    tensors: tuple
    kernel: str | None = None
    norm: str | None = None
    m: int | None = None
    d: int | None = None
    e: int | None = None
    masked: bool = False
    solver: str | None = None
    ns_backward: str | None = None
    aux: tuple = ()


def _devices(serves: Serves, tensors) -> str | None:
    devices = {t.device.type for t in tensors}
    if serves.devices is None or devices <= set(serves.devices):
        return None
    if serves.interpreted and devices == {"cpu"} and _runtime.triton_interpreted():
        return None
    hint = " (set TRITON_INTERPRET=1 to run Triton on the CPU)" if serves.interpreted else ""
    return f"tensors on {sorted(devices)}, not {'/'.join(serves.devices)}{hint}"


def _dtypes(serves: Serves, tensors) -> str | None:
    kinds = {t.dtype for t in tensors}
    if len(kinds) > 1:
        return f"mixed dtypes {sorted(str(d) for d in kinds)}"
    if serves.dtypes is not None and kinds and not kinds <= set(serves.dtypes):
        return f"dtype {next(iter(kinds))} (only {', '.join(str(d).removeprefix('torch.') for d in serves.dtypes)})"
    return None


def _sizes(serves: Serves, call: Call) -> str | None:
    """m (landmarks), d (head or feature dim), e (value dim) against the declared largest."""
    for name, size, limit in (("m", call.m, serves.max_m), ("d", call.d, serves.max_d), ("e", call.e, serves.max_e)):
        if limit is not None and size is not None and size > limit:
            return f"{name}={size} > {limit} (the most {serves.what} take{serves.limit_note})"
    return None


def _variants(serves: Serves, call: Call) -> str | None:
    """The first of the call's norm, solver and Newton–Schulz backward that ``serves`` has no form of."""
    for name, value, served in (("norm", call.norm, serves.norms), ("solver", call.solver, serves.solvers),
                                ("ns_backward", call.ns_backward, serves.ns_backwards)):
        if served is not None and value is not None and value not in served:
            return f"{name} {value!r} has no {serves.form} form (only {list(served)})"
    return None


def unserved(serves: Serves, call: Call) -> str | None:
    """Why a backend declaring ``serves`` cannot take ``call``, or None: the first failed clause in the order
    gradient (a forward-only backend), masks, norm / solver / ns_backward, kernel family, device, dtype, empty
    input, sizes."""
    tensors = [t for t in call.tensors if isinstance(t, torch.Tensor)]
    everything = tensors + [t for t in call.aux if isinstance(t, torch.Tensor)]
    if not serves.grad and torch.is_grad_enabled() and any(t.requires_grad for t in everything):
        return f"an input requires grad: {serves.what} run forward only"
    if call.masked and not serves.masks:
        return f"a key_padding_mask is not supported by {serves.what}"
    why = _variants(serves, call)
    if why is not None:
        return why
    if serves.kernels is not None and call.kernel is not None:
        spec = kernel_spec(call.kernel)
        if spec.id not in serves.kernels:
            return f"kernel {spec.name!r}: {serves.what} have no profile for its id {spec.id}"
    why = _devices(serves, everything) or _dtypes(serves, tensors)
    if why is not None:
        return why
    if any(t.numel() == 0 for t in tensors):
        return "empty input"
    return _sizes(serves, call)


def not_exportable() -> str | None:
    """What no declaration says, for every backend of custom kernels: they are not exportable to ONNX."""
    return "torch.onnx export in progress (custom kernels are not exportable)" if _runtime.onnx_exporting() else None


def triton_missing() -> str | None:
    """Why Triton cannot run here (not installed, no usable driver), or None."""
    ok, why = _runtime.triton_available()
    return None if ok else why
