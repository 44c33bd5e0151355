"""Plain PyTorch ground truth for the kernel primitives (DESIGN.md §1).

Broadcasting references: they materialise (..., N, M, d) and are meant for tests on small sizes.
"""

from __future__ import annotations

import torch

from ..kernel_families import KernelSpec, kernel_spec


def pairwise_l1_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||_1.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)


def pairwise_sq_l2_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||_2^2.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).pow(2).sum(-1)


def pairwise_accumulated_naive(x: torch.Tensor, y: torch.Tensor, spec: KernelSpec) -> torch.Tensor:
    """The family's accumulated distance (``KernelSpec.accumulation``): L1 or squared L2, (..., N, M)."""
    return pairwise_l1_naive(x, y) if spec.l1 else pairwise_sq_l2_naive(x, y)


def laplace_kernel_naive(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str = "laplacian") -> torch.Tensor:
    """k(x_i, y_j) = f(r(x_i, y_j) / lam) of the family ``kernel`` (``kernel_families``; the paper's:
    exp(-||x_i - y_j||_1 / lam))."""
    spec = kernel_spec(kernel)
    return spec.kernel_of(pairwise_accumulated_naive(x, y, spec), 1.0 / lam)


def laplace_kernel_matmul_naive(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return laplace_kernel_naive(x, y, lam, kernel) @ v
