"""Regularised inverse W⁺ ≈ (W + eps·I)^{-1} of the landmark kernel matrix (DESIGN.md §3).

``newton_schulz_pinv`` is the paper's solver. Its default backward is implicit: for V = P^{-1},
dL/dW = -V^T (dL/dV) V^T, evaluated at the returned V and never differentiated through the iterations
(the authors' and SOFT's choice). When the iteration has not converged this differs from the gradient
of the truncated iteration; ``backward="unrolled"`` gives that one instead.
``solver="cg"`` (ablation) and ``solver="exact"`` (tests; torch.linalg.solve) share the implicit backward.
On CUDA, with m <= 128 and no ``tol``, the iteration and the implicit backward run in the batched Triton
kernels of ``triton.py`` (selection "auto" or "triton" of ``laplacianformer.ops.kernel.backend``).
On the CPU, float32/float64 iterations without autograd run as one call of the C loop of ``native.py``
(selection "auto" or "cpu"; see ``naive.newton_schulz_iterate``); the implicit backward stays in torch.
"""

from __future__ import annotations

import torch

from ..validation import SOLVERS, check_choice, check_float_tensor, check_positive, check_positive_int
from .cg import conjugate_gradient_inverse
from .naive import initial_guess, newton_schulz_iterate, newton_schulz_pinv_unrolled, pinv_residual, regularise

__all__ = [
    "newton_schulz_pinv",
    "regularised_inverse",
    "pinv_residual",
    "conjugate_gradient_inverse",
    "newton_schulz_pinv_unrolled",
    "initial_guess",
    "regularise",
]


def _use_triton(p: torch.Tensor, tol: float | None = None) -> bool:
    from ..kernel.backend import _onnx_exporting, get_backend, triton_available

    return (
        p.is_cuda
        and tol is None
        and p.shape[-1] <= 128
        and p.dtype in (torch.float32, torch.float16, torch.bfloat16)
        and get_backend() in ("auto", "triton")
        and triton_available()[0]
        and not _onnx_exporting()
    )


def _solve(p: torch.Tensor, solver: str, iters: int, tol: float | None) -> torch.Tensor:
    if solver == "newton_schulz":
        if _use_triton(p, tol):
            from .triton import newton_schulz_iterate_triton

            return newton_schulz_iterate_triton(p, iters)
        return newton_schulz_iterate(p, iters, tol)
    if solver == "cg":
        return conjugate_gradient_inverse(p, iters, tol)
    eye = torch.eye(p.shape[-1], dtype=p.dtype, device=p.device).expand_as(p)
    return torch.linalg.solve(p, eye)


class _ImplicitInverse(torch.autograd.Function):
    """V = solve(W + eps·I) forward; dL/dW = -V^T G V^T backward (DESIGN.md §3)."""

    @staticmethod
    def forward(ctx, w, eps, solver, iters, tol):
        v = _solve(regularise(w, eps), solver, iters, tol)
        ctx.save_for_backward(v)
        return v

    @staticmethod
    def backward(ctx, grad_v):
        (v,) = ctx.saved_tensors
        if _use_triton(v):
            from .triton import implicit_grad_triton

            return implicit_grad_triton(v, grad_v), None, None, None, None
        vt = v.transpose(-1, -2)
        return -(vt @ grad_v @ vt), None, None, None, None


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
    check_choice("backward", backward, ("implicit", "unrolled"))
    check_positive_int("iters", iters)
    check_positive("eps", eps, allow_zero=True)
    if tol is not None:
        check_positive("tol", tol)
    work = w.float() if w.dtype in (torch.float16, torch.bfloat16) else w
    if backward == "unrolled":
        if solver != "newton_schulz":
            raise ValueError(f"backward: 'unrolled' is only defined for solver='newton_schulz', got solver={solver!r}")
        out = newton_schulz_pinv_unrolled(work, iters, eps)
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
    """Newton–Schulz pseudo-inverse of W + eps·I (DESIGN.md §3).

    w: (..., m, m) symmetric landmark kernel matrices.  Returns V (..., m, m), and with
    ``return_residual=True`` also ||I - P V||_F (...,) for diagnostics.
    """
    v = regularised_inverse(w, solver="newton_schulz", iters=iters, eps=eps, tol=tol, backward=backward)
    if not return_residual:
        return v
    with torch.no_grad():
        res = pinv_residual(regularise(w.to(v.dtype), eps), v)
    return v, res
