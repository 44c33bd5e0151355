"""Memory-light PyTorch composite of the kernel primitives: torch.cdist for the distance, then exp.

Stores only the (..., N, M) result, never (..., N, M, d). This is the baseline the fused kernels are
measured against (issue: the "torch.cdist(p=1) composite") and the portable fallback, including ONNX export.
"""

from __future__ import annotations

import torch


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, kind: str) -> torch.Tensor:
    """L1 (laplacian) or squared-L2 (gaussian) distances.  x: (..., N, d), y: (..., M, d) -> (..., N, M).

    torch.cdist has no half-precision CPU kernel: float16/bfloat16 CPU inputs are computed in float32 and
    the result is cast back.
    """
    if kind == "laplacian":
        if x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16):
            return torch.cdist(x.float(), y.float(), p=1.0).to(x.dtype)
        return torch.cdist(x, y, p=1.0)
    x2 = x.pow(2).sum(-1, keepdim=True)
    y2 = y.pow(2).sum(-1).unsqueeze(-2)
    return (x2 + y2 - 2.0 * (x @ y.transpose(-1, -2))).clamp_min(0.0)


def laplace_kernel_composite(x: torch.Tensor, y: torch.Tensor, lam: float, kind: str = "laplacian") -> torch.Tensor:
    """exp(-dist(x_i, y_j) / lam).  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return torch.exp(pairwise_distance(x, y, kind) * (-1.0 / lam))


def laplace_kernel_matmul_composite(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kind: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return laplace_kernel_composite(x, y, lam, kind) @ v
