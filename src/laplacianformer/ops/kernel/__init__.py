"""Kernel primitives of docs/DESIGN.md §1: k(x, y) = exp(-||x - y||_1 / lam) (and the Gaussian twin).

Public entry points, one dispatched op each (``ops/dispatch.py``, docs/DESIGN.md §6):
- ``laplace_kernel(x, y, lam, kernel)``: the (..., N, M) kernel matrix (op ``"kernel"``);
- ``laplace_kernel_matmul(x, y, v, lam, kernel)``: k(X, Y) @ V (op ``"kernel_matmul"``).
Backends, in the order automatic selection tries them: ``triton`` (``triton.py``, fused kernels; chosen
automatically for CUDA tensors only), ``cpu`` (``cpu.py``, the C loops; chosen automatically only when
they are built), ``composite`` (``composite.py``, torch.cdist; the reference, always serves) and
``naive`` (``naive.py``, the broadcasting ground truth; never chosen automatically).
Forcing a backend is ``ops.use(kernel=...)`` (``ops/_runtime.py``); ``ops.explain("kernel", x, y, lam, kernel)`` says why.

Under torch.compile and torch.export both functions call ``torch.library`` custom ops,
``laplacianformer::laplace_kernel`` and ``laplacianformer::laplace_kernel_matmul`` (fake implementations
for shapes, backward ops ``..._backward``), whose real implementation is the registry call: the compiler
sees one op instead of the dispatch code, and compiled graphs run the fast paths (docs/DESIGN.md §6.5).
Eager calls go to the registry directly.
"""

from __future__ import annotations

import torch

from .. import _runtime
from ..capabilities import Call, Serves, not_exportable, triton_missing, unserved
from ..dispatch import Backend, Op
from ..kernel_families import kernel_spec
from ..validation import check_float_tensor, check_kernel, check_positive
from . import native
from .composite import (
    laplace_kernel_composite,
    laplace_kernel_grad_composite,
    laplace_kernel_matmul_composite,
    laplace_kernel_matmul_grad_composite,
    pairwise_distance,
)
from .cpu import laplace_kernel_cpu, laplace_kernel_grad_cpu, laplace_kernel_matmul_cpu, laplace_kernel_matmul_grad_cpu
from .limits import TRITON_KERNEL_IDS, TRITON_MAX_D, TRITON_MAX_E, triton_unfit
from .naive import laplace_kernel_matmul_naive, laplace_kernel_naive, pairwise_l1_naive, pairwise_sq_l2_naive

__all__ = [
    "laplace_kernel",
    "laplace_kernel_matmul",
    "KERNEL",
    "KERNEL_MATMUL",
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

def _kernel_call(x, y, lam=4.0, kernel="laplacian") -> Call:
    """The ``kernel`` op's arguments as the ``Call`` its backends' declarations are checked against."""
    return Call((x, y), kernel=kernel, d=x.shape[-1])


def _matmul_call(x, y, v, lam=4.0, kernel="laplacian") -> Call:
    """The ``kernel_matmul`` op's arguments as its ``Call``."""
    return Call((x, y, v), kernel=kernel, d=x.shape[-1], e=v.shape[-1])


CPU = Serves("the C loops", devices=("cpu",), dtypes=(torch.float32, torch.float64))
TRITON = Serves("the Triton kernels", devices=("cuda",), interpreted=True,
                dtypes=(torch.float32, torch.float16, torch.bfloat16), kernels=TRITON_KERNEL_IDS,
                max_d=TRITON_MAX_D, max_e=TRITON_MAX_E,
                limit_note="; four 32-wide chunks of a row of x and of dV, compiled and checked for register "
                           "spills up to 128 only")
"""What the cpu and triton backends of both ops serve (``ops/capabilities.py``); naive and composite serve all."""


def _cpu_auto_refusal(*_inputs) -> str | None:
    if not native.available():
        return f"C loops unavailable ({native.load_error()}); its PyTorch fallback is slower than the composite"
    return None


def _triton_backward_unfit(call: Call) -> str | None:
    """The backward with V that no launch configuration compiles without spills (``limits.triton_unfit``): refused
    when a gradient may be needed."""
    tensors = call.tensors
    if call.e is None or not (torch.is_grad_enabled() and any(t.requires_grad for t in tensors)):
        return None
    return triton_unfit(kernel_spec(call.kernel).l1, call.d, call.e, tensors[0].dtype)


def _cpu_refusal(*inputs) -> str | None:
    return not_exportable() or unserved(CPU, _kernel_call(*inputs))


def _cpu_matmul_refusal(*inputs) -> str | None:
    return not_exportable() or unserved(CPU, _matmul_call(*inputs))


def _triton_refusal(*inputs) -> str | None:
    return not_exportable() or unserved(TRITON, _kernel_call(*inputs)) or triton_missing()


def _triton_matmul_refusal(*inputs) -> str | None:
    call = _matmul_call(*inputs)
    return not_exportable() or unserved(TRITON, call) or triton_missing() or _triton_backward_unfit(call)


def _triton_auto_refusal(x, *_inputs) -> str | None:
    if x.device.type != "cuda":
        return "only chosen automatically for CUDA tensors (the interpreter is for tests)"
    return None


def _naive_auto_refusal(*_inputs) -> str | None:
    return "the ground truth for tests (it materialises (..., N, M, d))"


def _triton_kernel(x, y, lam, kernel):
    from .triton import laplace_kernel_triton

    return laplace_kernel_triton(x, y, lam, kernel_spec(kernel).id)


def _triton_matmul(x, y, v, lam, kernel):
    from .triton import laplace_kernel_matmul_triton

    return laplace_kernel_matmul_triton(x, y, v, lam, kernel_spec(kernel).id)


def _triton_kernel_grad(x, y, out, grad, lam, kernel):
    from ..layout import flatten_batch
    from .triton import laplace_kernel_bwd

    m = y.shape[-2]
    dx, dy = laplace_kernel_bwd(flatten_batch(x), flatten_batch(y), grad.reshape(-1, x.shape[-2], m).contiguous(),
                                out.reshape(-1, x.shape[-2], m).contiguous(), -1.0 / float(lam), kernel_spec(kernel).id)
    return dx.reshape(x.shape), dy.reshape(y.shape)


def _triton_matmul_grad(x, y, v, grad, lam, kernel):
    from ..layout import flatten_batch
    from .triton import laplace_matmul_bwd

    g3 = grad.reshape(-1, x.shape[-2], v.shape[-1]).contiguous()
    dx, dy, dv = laplace_matmul_bwd(flatten_batch(x), flatten_batch(y), flatten_batch(v), g3, -1.0 / float(lam),
                                    kernel_spec(kernel).id)
    return dx.reshape(x.shape), dy.reshape(y.shape), dv.reshape(v.shape)


# ``grad`` of a kernel backend: (x, y, out, grad, lam, kernel) -> (dX, dY), out = the kernel matrix;
# of a kernel_matmul backend: (x, y, v, grad, lam, kernel) -> (dX, dY, dV). Used by the custom ops below.
KERNEL = Op("kernel", [
    Backend("triton", _triton_kernel, _triton_refusal, _triton_auto_refusal, _triton_kernel_grad),
    Backend("cpu", laplace_kernel_cpu, _cpu_refusal, _cpu_auto_refusal, laplace_kernel_grad_cpu),
    Backend("naive", laplace_kernel_naive, auto_refusal=_naive_auto_refusal, grad=laplace_kernel_grad_composite),
    Backend("composite", laplace_kernel_composite, grad=laplace_kernel_grad_composite),
], log="laplacianformer.ops.kernel", signature="laplace_kernel(x, y, lam, kernel): x (..., N, d), y (..., M, d)")

KERNEL_MATMUL = Op("kernel_matmul", [
    Backend("triton", _triton_matmul, _triton_matmul_refusal, _triton_auto_refusal, _triton_matmul_grad),
    Backend("cpu", laplace_kernel_matmul_cpu, _cpu_matmul_refusal, _cpu_auto_refusal, laplace_kernel_matmul_grad_cpu),
    Backend("naive", laplace_kernel_matmul_naive, auto_refusal=_naive_auto_refusal,
            grad=laplace_kernel_matmul_grad_composite),
    Backend("composite", laplace_kernel_matmul_composite, grad=laplace_kernel_matmul_grad_composite),
], log="laplacianformer.ops.kernel", signature="laplace_kernel_matmul(x, y, v, lam, kernel): v (..., M, e)")


def _contiguous(ts):
    return tuple(t.contiguous() for t in ts)


@torch.library.custom_op("laplacianformer::laplace_kernel", mutates_args=())
def _kernel_graph_op(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str) -> torch.Tensor:
    """k(X, Y) through the registry.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return KERNEL(x, y, lam, kernel).contiguous()


@_kernel_graph_op.register_fake
def _(x, y, lam, kernel):
    return x.new_empty(*x.shape[:-1], y.shape[-2])


@torch.library.custom_op("laplacianformer::laplace_kernel_backward", mutates_args=())
def _kernel_graph_bwd(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, lam: float,
                      kernel: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of ``laplace_kernel`` for dL/dK ``grad`` and K ``out`` (..., N, M): the ``grad`` of the
    backend the registry selects for (x, y)."""
    return _contiguous(KERNEL.select(x, y, lam, kernel).grad(x, y, out, grad, lam, kernel))


@_kernel_graph_bwd.register_fake
def _(grad, x, y, out, lam, kernel):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(y, memory_format=torch.contiguous_format)


def _kernel_setup(ctx, inputs, output):
    x, y, ctx.lam, ctx.kernel = inputs
    ctx.save_for_backward(x, y, output)


def _kernel_backward(ctx, grad):
    x, y, out = ctx.saved_tensors
    dx, dy = _kernel_graph_bwd(grad, x, y, out, ctx.lam, ctx.kernel)
    return dx, dy, None, None


_kernel_graph_op.register_autograd(_kernel_backward, setup_context=_kernel_setup)


@torch.library.custom_op("laplacianformer::laplace_kernel_matmul", mutates_args=())
def _matmul_graph_op(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str) -> torch.Tensor:
    """k(X, Y) @ V through the registry.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return KERNEL_MATMUL(x, y, v, lam, kernel).contiguous()


@_matmul_graph_op.register_fake
def _(x, y, v, lam, kernel):
    return x.new_empty(*x.shape[:-1], v.shape[-1])


@torch.library.custom_op("laplacianformer::laplace_kernel_matmul_backward", mutates_args=())
def _matmul_graph_bwd(grad: torch.Tensor, x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX, dY, dV) of ``laplace_kernel_matmul`` for dL/dO ``grad`` (..., N, e): the ``grad`` of the
    backend the registry selects for (x, y, v)."""
    return _contiguous(KERNEL_MATMUL.select(x, y, v, lam, kernel).grad(x, y, v, grad, lam, kernel))


@_matmul_graph_bwd.register_fake
def _(grad, x, y, v, lam, kernel):
    return tuple(torch.empty_like(t, memory_format=torch.contiguous_format) for t in (x, y, v))


def _matmul_setup(ctx, inputs, output):
    x, y, v, ctx.lam, ctx.kernel = inputs
    ctx.save_for_backward(x, y, v)


def _matmul_backward(ctx, grad):
    x, y, v = ctx.saved_tensors
    dx, dy, dv = _matmul_graph_bwd(grad, x, y, v, ctx.lam, ctx.kernel)
    return dx, dy, dv, None, None


_matmul_graph_op.register_autograd(_matmul_backward, setup_context=_matmul_setup)


def _check_xy(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str) -> None:
    check_float_tensor("x", x)
    check_float_tensor("y", y)
    if x.dim() < 2 or y.dim() != x.dim():
        raise ValueError(f"x, y: expected (..., N, d) and (..., M, d) of one rank >= 2, got {tuple(x.shape)} and {tuple(y.shape)}")
    if x.shape[:-2] != y.shape[:-2] or x.shape[-1] != y.shape[-1]:
        raise ValueError(f"y: expected shape {tuple(x.shape[:-2])} + (M, {x.shape[-1]}), got {tuple(y.shape)}")
    check_positive("lam", lam)
    check_kernel(kernel)


def laplace_kernel(x: torch.Tensor, y: torch.Tensor, lam: float = 4.0, kernel: str = "laplacian") -> torch.Tensor:
    """Kernel matrix k(x_i, y_j) of the family ``kernel`` (``kernel_families``; the paper's
    exp(-||x_i - y_j||_1 / lam)).  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    _check_xy(x, y, lam, kernel)
    if _runtime.graph_ops():
        return _kernel_graph_op(x, y, float(lam), kernel)
    return KERNEL(x, y, lam, kernel)


def laplace_kernel_matmul(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float = 4.0, kernel: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V for the family ``kernel``.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    _check_xy(x, y, lam, kernel)
    check_float_tensor("v", v)
    if v.dim() != y.dim() or v.shape[:-1] != y.shape[:-1]:
        raise ValueError(f"v: expected shape {tuple(y.shape[:-1])} + (e,), got {tuple(v.shape)}")
    if _runtime.graph_ops():
        return _matmul_graph_op(x, y, v, float(lam), kernel)
    return KERNEL_MATMUL(x, y, v, lam, kernel)
