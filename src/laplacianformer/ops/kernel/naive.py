"""Plain PyTorch ground truth for the kernel primitives (DESIGN.md §1).

Broadcasting references: they materialise (..., N, M, d) and are meant for tests on small sizes.
"""

from __future__ import annotations

import torch


def pairwise_l1_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||_1.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)


def pairwise_sq_l2_naive(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """||x_i - y_j||_2^2.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).pow(2).sum(-1)


def laplace_kernel_naive(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str = "laplacian") -> torch.Tensor:
    """k(x_i, y_j) = exp(-||x_i - y_j||_1 / lam) (laplacian) or exp(-||x_i - y_j||^2 / lam) (gaussian)."""
    dist = pairwise_l1_naive(x, y) if kernel == "laplacian" else pairwise_sq_l2_naive(x, y)
    return torch.exp(-dist / lam)


def laplace_kernel_matmul_naive(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return laplace_kernel_naive(x, y, lam, kernel) @ v
