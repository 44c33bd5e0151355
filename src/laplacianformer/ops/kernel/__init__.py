"""Kernel primitives of DESIGN.md §1: k(x, y) = exp(-||x - y||_1 / lam) (and the Gaussian twin).

Public entry points (one dispatcher each):
- ``laplace_kernel(x, y, lam, kind)``: the (..., N, M) kernel matrix;
- ``laplace_kernel_matmul(x, y, v, lam, kind)``: k(X, Y) @ V.
``naive.py`` is the ground truth, ``composite.py`` the torch.cdist composite, ``cpu.py`` the fast CPU
path and ``triton.py`` the fused Triton kernels; ``backend.py`` chooses among them (``set_backend``,
``backend``, ``explain_dispatch``).
"""

from __future__ import annotations

import torch

from ..validation import KERNELS, check_choice, check_float_tensor, check_positive
from .backend import BACKENDS, backend, explain_dispatch, get_backend, select, set_backend
from .composite import laplace_kernel_composite, laplace_kernel_matmul_composite, pairwise_distance
from .cpu import laplace_kernel_cpu, laplace_kernel_matmul_cpu
from .naive import laplace_kernel_matmul_naive, laplace_kernel_naive, pairwise_l1_naive, pairwise_sq_l2_naive

__all__ = [
    "laplace_kernel",
    "laplace_kernel_matmul",
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
    name = select((x, y), kind, "kernel")
    if name == "cpu":
        return laplace_kernel_cpu(x, y, lam, kind)
    if name == "triton":
        from .triton import laplace_kernel_triton

        return laplace_kernel_triton(x, y, lam, kind)
    if name == "naive":
        return laplace_kernel_naive(x, y, lam, kind)
    return laplace_kernel_composite(x, y, lam, kind)


def laplace_kernel_matmul(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float = 4.0, kind: str = "laplacian"
) -> torch.Tensor:
    """exp(-||x_i - y_j||_1 / lam) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    _check_xy(x, y, lam, kind)
    check_float_tensor("v", v)
    if v.dim() != y.dim() or v.shape[:-1] != y.shape[:-1]:
        raise ValueError(f"v: expected shape {tuple(y.shape[:-1])} + (e,), got {tuple(v.shape)}")
    name = select((x, y, v), kind, "matmul")
    if name == "cpu":
        return laplace_kernel_matmul_cpu(x, y, v, lam, kind)
    if name == "triton":
        from .triton import laplace_kernel_matmul_triton

        return laplace_kernel_matmul_triton(x, y, v, lam, kind)
    if name == "naive":
        return laplace_kernel_matmul_naive(x, y, v, lam, kind)
    return laplace_kernel_matmul_composite(x, y, v, lam, kind)
