"""Regularised inverse W⁺ ≈ (W + eps·I)^{-1} of the landmark kernel matrix (docs/DESIGN.md §3).

``newton_schulz_pinv`` is the paper's solver. Its default backward is implicit: for V = P^{-1},
dL/dW = -V^T (dL/dV) V^T, evaluated at the returned V and never differentiated through the iterations
(the authors' and SOFT's choice). When the iteration has not converged this differs from the gradient
of the truncated iteration; ``backward="unrolled"`` gives that one instead (always the torch loop).
``solver="cg"`` (ablation) and ``solver="exact"`` (tests; torch.linalg.solve) share the implicit backward.

Two dispatched ops (``ops/dispatch.py``, docs/DESIGN.md §6), backends in the order automatic selection
tries them:
- ``newton_schulz`` (``newton_schulz_iterate(p, iters, tol, symmetric)``): ``triton`` (``triton.py``,
  chosen automatically for CUDA tensors; m <= 128, no ``tol``; the reference's keep-best rule), ``cpu`` (the C
  loop of ``native.py``: symmetric float32/float64 CPU tensors needing no gradient, outside graph capture
  and dispatch modes), ``torch`` (``naive.newton_schulz_iterate_reference``, the reference).
- ``newton_schulz_grad`` (the implicit backward, ``implicit_grad(v, grad_v)``): ``triton``, ``torch``.

Under torch.compile and torch.export, ``regularised_inverse`` (implicit backward) calls the custom op
``laplacianformer::regularised_inverse`` (backward op ``laplacianformer::regularised_inverse_backward``),
whose real implementation runs the registry, so compiled graphs use the C loop / Triton kernel
(docs/DESIGN.md §6.5). Eager calls run ``_ImplicitInverse`` directly.
"""

from __future__ import annotations

import torch

from .. import _runtime
from ..capabilities import Call, Serves, not_exportable, triton_missing, unserved
from ..dispatch import Backend, Op
from ..validation import NS_BACKWARDS, SOLVERS, check_choice, check_float_tensor, check_positive, check_positive_int
from . import native
from .cg import conjugate_gradient_inverse
from .naive import (
    CHECK_EVERY,
    initial_guess,
    newton_schulz_iterate_reference,
    newton_schulz_pinv_unrolled,
    pinv_residual,
    regularise,
)

__all__ = [
    "newton_schulz_pinv",
    "regularised_inverse",
    "newton_schulz_iterate",
    "implicit_grad",
    "pinv_residual",
    "conjugate_gradient_inverse",
    "newton_schulz_pinv_unrolled",
    "initial_guess",
    "regularise",
    "NEWTON_SCHULZ",
    "NEWTON_SCHULZ_GRAD",
]

TRITON_MAX_M = 128


def _solve_call(p, iters=20, tol=None, symmetric=True) -> Call:
    """The ``newton_schulz`` op's arguments as the ``Call`` its backends' declarations are checked against."""
    return Call((p,), m=p.shape[-1])


def _grad_call(v, grad_v) -> Call:
    """The ``newton_schulz_grad`` op's arguments as its ``Call`` (the dtype and requires_grad are V's)."""
    return Call((v,), m=v.shape[-1], aux=(grad_v,))


TRITON = Serves("the Triton kernels", devices=("cuda",), interpreted=True,
                dtypes=(torch.float32, torch.float16, torch.bfloat16), max_m=TRITON_MAX_M,
                limit_note="; one program per matrix, tiles through an L2-resident scratch, compiled and checked "
                           "for register spills up to m=128 only")
CPU = Serves("the C loop", devices=("cpu",), dtypes=(torch.float32, torch.float64), grad=False)
"""What the triton and cpu backends serve (``ops/capabilities.py``); torch serves everything."""


def _triton_options(p, iters=20, tol=None, symmetric=True) -> str | None:
    """The solve's options the Triton kernel has no form of (not data: they change the iteration)."""
    if tol is not None:
        return ("tol given (the Triton kernel runs all iters steps, keeping the best checked iterate; it has "
                "no batch-wide early stop)")
    if not symmetric:
        return "symmetric=False (the Triton kernel starts from alpha·P, the symmetric guess)"
    return None


def _triton_solve_refusal(*inputs) -> str | None:
    return not_exportable() or _triton_options(*inputs) or unserved(TRITON, _solve_call(*inputs)) or triton_missing()


def _triton_grad_refusal(*inputs) -> str | None:
    return not_exportable() or unserved(TRITON, _grad_call(*inputs)) or triton_missing()


def _triton_auto_refusal(p: torch.Tensor, *_rest) -> str | None:
    if p.device.type != "cuda":
        return "only chosen automatically for CUDA tensors (the interpreter is for tests)"
    return None


def _cpu_only(p, iters=20, tol=None, symmetric=True) -> str | None:
    """What the C loop needs besides its declaration: a symmetric P in a plain strided tensor, and the library."""
    if not symmetric:
        return "symmetric=False (the C loop assumes symmetric P)"
    if type(p) is not torch.Tensor:
        return f"a tensor subclass ({type(p).__name__}); the torch loop runs on it"
    if p.layout is not torch.strided:
        return f"layout {p.layout}, not strided"
    return None


def _cpu_refusal(*inputs) -> str | None:
    why = _runtime.capture_reason(modes=True)  # first: under torch.compile dynamo folds it
    why = why or _cpu_only(*inputs) or unserved(CPU, _solve_call(*inputs))
    if why is None and not native.available():
        why = f"C loop unavailable ({native.load_error()})"
    return why


def _solve_triton(p, iters, tol=None, symmetric=True):
    from .triton import newton_schulz_iterate_triton

    return newton_schulz_iterate_triton(p, iters)


def _solve_cpu(p, iters, tol=None, symmetric=True):
    return native.newton_schulz_native(p, iters, tol, CHECK_EVERY)


def _grad_triton(v, grad_v):
    from .triton import implicit_grad_triton

    return implicit_grad_triton(v, grad_v)


def _grad_torch(v, grad_v):
    vt = v.transpose(-1, -2)
    return -(vt @ grad_v @ vt)


NEWTON_SCHULZ = Op("newton_schulz", [
    Backend("triton", _solve_triton, _triton_solve_refusal, _triton_auto_refusal),
    Backend("cpu", _solve_cpu, _cpu_refusal),
    Backend("torch", newton_schulz_iterate_reference),
], signature="newton_schulz_iterate(p, iters, tol, symmetric): p (..., m, m)")

NEWTON_SCHULZ_GRAD = Op("newton_schulz_grad", [
    Backend("triton", _grad_triton, _triton_grad_refusal, _triton_auto_refusal),
    Backend("torch", _grad_torch),
], signature="implicit_grad(v, grad_v): v, grad_v (..., m, m)")


def newton_schulz_iterate(
    p: torch.Tensor, iters: int, tol: float | None = None, symmetric: bool = True
) -> torch.Tensor:
    """V ≈ P^{-1} by ``iters`` steps of V <- 2V - V (P V).  p: (..., m, m) -> (..., m, m).

    The op ``newton_schulz``: ``naive.newton_schulz_iterate_reference`` (its docstring has the check
    schedule and the keep-best rule), or the same iteration as one C call or one Triton launch."""
    return NEWTON_SCHULZ(p, iters, tol, symmetric)


def implicit_grad(v: torch.Tensor, grad_v: torch.Tensor) -> torch.Tensor:
    """dL/dW = -Vᵀ (dL/dV) Vᵀ, the implicit backward (op ``newton_schulz_grad``).  v, grad_v: (..., m, m)."""
    return NEWTON_SCHULZ_GRAD(v, grad_v)


def _solve(p: torch.Tensor, solver: str, iters: int, tol: float | None) -> torch.Tensor:
    if solver == "newton_schulz":
        return newton_schulz_iterate(p, iters, tol)
    if solver == "cg":
        return conjugate_gradient_inverse(p, iters, tol)
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device).expand_as(p)
    return torch.linalg.solve(p, eye)


class _ImplicitInverse(torch.autograd.Function):
    """V = solve(W + eps·I) forward; dL/dW = -V^T G V^T backward (docs/DESIGN.md §3)."""

    @staticmethod
    def forward(ctx, w, eps, solver, iters, tol):
        v = _solve(regularise(w, eps), solver, iters, tol)
        ctx.save_for_backward(v)
        return v

    @staticmethod
    def backward(ctx, grad_v):
        (v,) = ctx.saved_tensors
        return implicit_grad(v, grad_v), None, None, None, None


@torch.library.custom_op("laplacianformer::regularised_inverse", mutates_args=())
def _inverse_graph_op(w: torch.Tensor, eps: float, solver: str, iters: int, tol: float | None) -> torch.Tensor:
    """(W + eps·I)^{-1} through the registry.  w: (..., m, m) -> (..., m, m)."""
    return _solve(regularise(w, eps), solver, iters, tol).contiguous()


@_inverse_graph_op.register_fake
def _(w, eps, solver, iters, tol):
    return torch.empty_like(w, memory_format=torch.contiguous_format)


@torch.library.custom_op("laplacianformer::regularised_inverse_backward", mutates_args=())
def _inverse_graph_bwd(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """dL/dW = -Vᵀ G Vᵀ (op ``newton_schulz_grad``).  v, grad: (..., m, m)."""
    return implicit_grad(v, grad).contiguous()


@_inverse_graph_bwd.register_fake
def _(v, grad):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


def _inverse_setup(ctx, inputs, output):
    ctx.save_for_backward(output)


def _inverse_backward(ctx, grad):
    (v,) = ctx.saved_tensors
    return _inverse_graph_bwd(v, grad), None, None, None, None


_inverse_graph_op.register_autograd(_inverse_backward, setup_context=_inverse_setup)


def regularised_inverse(
    w: torch.Tensor,
    *,
    solver: str = "newton_schulz",
    iters: int = 20,
    eps: float = 0.01,
    tol: float | None = None,
    backward: str = "implicit",
) -> torch.Tensor:
    """(W + eps·I)^{-1} by the chosen solver.  w: (..., m, m) -> (..., m, m).

    The solvers are computed in at least float32 (half inputs are upcast) and returned in w's dtype.
    """
    check_float_tensor("w", w)
    if w.dim() < 2 or w.shape[-1] != w.shape[-2]:
        raise ValueError(f"w: expected square matrices (..., m, m), got shape {tuple(w.shape)}")
    check_choice("solver", solver, SOLVERS)
    check_choice("backward", backward, NS_BACKWARDS)
    check_positive_int("iters", iters)
    check_positive("eps", eps, allow_zero=True)
    if tol is not None:
        check_positive("tol", tol)
    work = w.float() if w.dtype in (torch.float16, torch.bfloat16) else w
    if backward == "unrolled":
        if solver != "newton_schulz":
            raise ValueError(f"backward: 'unrolled' is only defined for solver='newton_schulz', got solver={solver!r}")
        out = newton_schulz_pinv_unrolled(work, iters, eps)
    elif _runtime.graph_ops():
        out = _inverse_graph_op(work, float(eps), solver, int(iters), None if tol is None else float(tol))
    else:
        out = _ImplicitInverse.apply(work, float(eps), solver, iters, tol)
    return out.to(w.dtype)


def newton_schulz_pinv(
    w: torch.Tensor,
    iters: int = 20,
    eps: float = 0.01,
    *,
    tol: float | None = None,
    backward: str = "implicit",
    return_residual: bool = False,
):
    """Newton–Schulz pseudo-inverse of W + eps·I (docs/DESIGN.md §3).

    w: (..., m, m) symmetric landmark kernel matrices.  Returns V (..., m, m), and with
    ``return_residual=True`` also ||I - P V||_F (...,) for diagnostics.
    """
    v = regularised_inverse(w, solver="newton_schulz", iters=iters, eps=eps, tol=tol, backward=backward)
    if not return_residual:
        return v
    with torch.no_grad():
        res = pinv_residual(regularise(w.to(v.dtype), eps), v)
    return v, res
