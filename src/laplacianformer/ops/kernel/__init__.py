"""Kernel primitives of docs/DESIGN.md §1: k(x, y) = exp(-||x - y||_1 / lam) (and the Gaussian twin).

Public entry points, one dispatched op each (``ops/dispatch.py``, docs/DESIGN.md §6):
- ``laplace_kernel(x, y, lam, kind)``: the (..., N, M) kernel matrix (op ``"kernel"``);
- ``laplace_kernel_matmul(x, y, v, lam, kind)``: k(X, Y) @ V (op ``"kernel_matmul"``).
Backends, in the order automatic selection tries them: ``triton`` (``triton.py``, fused kernels; chosen
automatically for CUDA tensors only), ``cpu`` (``cpu.py``, the C loops; chosen automatically only when
they are built), ``composite`` (``composite.py``, torch.cdist; the reference, always serves) and
``naive`` (``naive.py``, the broadcasting ground truth; never chosen automatically).
``backend.py`` keeps the older selection API (``set_backend``, ``backend``, ``explain_dispatch``).
"""

from __future__ import annotations

import torch

from .. import _runtime
from ..dispatch import Backend, Op
from ..validation import KERNELS, check_choice, check_float_tensor, check_positive
from . import native
from .backend import BACKENDS, backend, explain_dispatch, get_backend, set_backend
from .composite import laplace_kernel_composite, laplace_kernel_matmul_composite, pairwise_distance
from .cpu import laplace_kernel_cpu, laplace_kernel_matmul_cpu
from .limits import TRITON_MAX_D as _TRITON_MAX_D
from .limits import TRITON_MAX_E as _TRITON_MAX_E
from .limits import triton_unfit
from .naive import laplace_kernel_matmul_naive, laplace_kernel_naive, pairwise_l1_naive, pairwise_sq_l2_naive

__all__ = [
    "laplace_kernel",
    "laplace_kernel_matmul",
    "KERNEL",
    "KERNEL_MATMUL",
    "BACKENDS",
    "backend",
    "set_backend",
    "get_backend",
    "explain_dispatch",
    "laplace_kernel_cpu",
    "laplace_kernel_matmul_cpu",
    "laplace_kernel_naive",
    "laplace_kernel_matmul_naive",
    "laplace_kernel_composite",
    "laplace_kernel_matmul_composite",
    "pairwise_distance",
    "pairwise_l1_naive",
    "pairwise_sq_l2_naive",
]

_TRITON_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _tensors(inputs) -> list[torch.Tensor]:
    return [t for t in inputs if isinstance(t, torch.Tensor)]


def _custom_kernel_refusal(tensors: list[torch.Tensor]) -> str | None:
    """What the cpu and triton backends both need: no ONNX export, one dtype."""
    if _runtime.onnx_exporting():
        return "torch.onnx export in progress (custom kernels are not exportable)"
    dtypes = {t.dtype for t in tensors}
    if len(dtypes) != 1:
        return f"mixed dtypes {sorted(str(d) for d in dtypes)}"
    return None


def _cpu_refusal(*inputs) -> str | None:
    tensors = _tensors(inputs)
    why = _custom_kernel_refusal(tensors)
    if why is not None:
        return why
    devices = {t.device.type for t in tensors}
    if devices != {"cpu"}:
        return f"tensors on {sorted(devices)}, not cpu"
    if tensors[0].dtype not in (torch.float32, torch.float64):
        return f"dtype {tensors[0].dtype} (the CPU path takes float32/float64)"
    return None


def _cpu_auto_refusal(*_inputs) -> str | None:
    if not native.available():
        return f"C loops unavailable ({native.load_error()}); its PyTorch fallback is slower than the composite"
    return None


def _triton_refusal(*inputs) -> str | None:
    tensors = _tensors(inputs)
    why = _custom_kernel_refusal(tensors)
    if why is not None:
        return why
    devices = {t.device.type for t in tensors}
    if devices != {"cuda"} and not _runtime.triton_interpreted():
        return f"tensors on {sorted(devices)}, not cuda (set TRITON_INTERPRET=1 to run Triton on the CPU)"
    if tensors[0].dtype not in _TRITON_DTYPES:
        return f"dtype {tensors[0].dtype} (the Triton kernels take float32/float16/bfloat16)"
    d = tensors[0].shape[-1]
    if d > _TRITON_MAX_D:
        return (f"feature dim d={d} > {_TRITON_MAX_D} (the kernels hold at most four 32-wide chunks of a row; "
                "compiled and checked for register spills up to d=128 only)")
    if len(tensors) > 2 and tensors[2].shape[-1] > _TRITON_MAX_E:
        return (f"value dim e={tensors[2].shape[-1]} > {_TRITON_MAX_E} (the backward holds at most four 32-wide "
                "chunks of dV; compiled and checked for register spills up to e=128 only)")
    ok, why = _runtime.triton_available()
    if not ok:
        return why
    if len(tensors) > 2 and torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
        return triton_unfit(inputs[-1] == "laplacian", d, tensors[2].shape[-1], tensors[0].dtype)
    return None


def _triton_auto_refusal(*inputs) -> str | None:
    if _tensors(inputs)[0].device.type != "cuda":
        return "only chosen automatically for CUDA tensors (the interpreter is for tests)"
    return None


def _naive_auto_refusal(*_inputs) -> str | None:
    return "the ground truth for tests (it materialises (..., N, M, d))"


def _triton_kernel(*inputs):
    from .triton import laplace_kernel_triton

    return laplace_kernel_triton(*inputs)


def _triton_matmul(*inputs):
    from .triton import laplace_kernel_matmul_triton

    return laplace_kernel_matmul_triton(*inputs)


KERNEL = Op("kernel", [
    Backend("triton", _triton_kernel, _triton_refusal, _triton_auto_refusal),
    Backend("cpu", laplace_kernel_cpu, _cpu_refusal, _cpu_auto_refusal),
    Backend("naive", laplace_kernel_naive, auto_refusal=_naive_auto_refusal),
    Backend("composite", laplace_kernel_composite),
], log="laplacianformer.ops.kernel", signature="laplace_kernel(x, y, lam, kind): x (..., N, d), y (..., M, d)")

KERNEL_MATMUL = Op("kernel_matmul", [
    Backend("triton", _triton_matmul, _triton_refusal, _triton_auto_refusal),
    Backend("cpu", laplace_kernel_matmul_cpu, _cpu_refusal, _cpu_auto_refusal),
    Backend("naive", laplace_kernel_matmul_naive, auto_refusal=_naive_auto_refusal),
    Backend("composite", laplace_kernel_matmul_composite),
], log="laplacianformer.ops.kernel", signature="laplace_kernel_matmul(x, y, v, lam, kind): v (..., M, e)")


def _check_xy(x: torch.Tensor, y: torch.Tensor, lam: float, kind: str) -> None:
    check_float_tensor("x", x)
    check_float_tensor("y", y)
    if x.dim() < 2 or y.dim() != x.dim():
        raise ValueError(f"x, y: expected (..., N, d) and (..., M, d) of one rank >= 2, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-1]:
        raise ValueError(f"y: expected shape {tuple(x.shape[:-2])} + (M, {x.shape[-1]}), got {tuple(y.shape)}")
    check_positive("lam", lam)
    check_choice("kind", kind, KERNELS)


def laplace_kernel(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0, kind: str = "laplacian") -> torch.Tensor:
    """Kernel matrix exp(-||x_i - y_j||_1 / lam).  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    _check_xy(x, y, lam, kind)
    return KERNEL(x, y, lam, kind)


def laplace_kernel_matmul(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float = 4.0, kind: str = "laplacian"
) -> torch.Tensor:
    """exp(-||x_i - y_j||_1 / lam) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    _check_xy(x, y, lam, kind)
    check_float_tensor("v", v)
    if v.dim() != y.dim() or v.shape[:-1] != y.shape[:-1]:
        raise ValueError(f"v: expected shape {tuple(y.shape[:-1])} + (e,), got {tuple(v.shape)}")
    return KERNEL_MATMUL(x, y, v, lam, kind)
