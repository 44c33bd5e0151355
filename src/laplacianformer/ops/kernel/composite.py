"""Memory-light PyTorch composite of the kernel primitives: torch.cdist for the distance, then the family's
profile (``kernel_families``).

Stores only the (..., N, M) result, never (..., N, M, d). This is the baseline the fused kernels are
measured against (issue: the "torch.cdist(p=1) composite") and the portable fallback, including ONNX export.

While a graph is exported to ONNX the L1 and L2 accumulations take ``export_distance`` instead of
torch.cdist: ONNX has no pairwise-distance op, and cdist's translation as one broadcast formed the
(..., N, M, d) tensor inside the graph (one Tiny forward at 1024² in onnxruntime: a peak RSS increment of
1,874 MiB, 330 MiB with ``export_distance``, eager mode 239 MiB; benchmarks/results/onnx_deploy_cpu_threads2.md).
"""

from __future__ import annotations

import torch

from .. import _runtime
from ..kernel_families import kernel_spec

EXPORT_CHUNK = 8
"""Features per step of ``export_distance``: its largest intermediate is (..., EXPORT_CHUNK, M, N). 0: the
export records torch.cdist as eager mode runs it (the broadcast form before issue 42; for comparisons)."""


def pairwise_distance(x: torch.Tensor, y: torch.Tensor, kernel: str) -> torch.Tensor:
    """The family's accumulated distance (``KernelSpec.accumulation``: L1, or squared L2 for the L2 families).
    x: (..., N, d), y: (..., M, d) -> (..., N, M).

    torch.cdist has no half-precision CPU kernel: float16/bfloat16 CPU inputs are computed in float32 and
    the result is cast back.
    """
    spec = kernel_spec(kernel)
    if (spec.l1 or spec.distance == "l2") and EXPORT_CHUNK and _runtime.onnx_exporting():
        return export_distance(x, y, spec.l1)
    if spec.l1 or spec.distance == "l2":
        # L2 without the Gram expansion: its cancellation near r = 0 would reach r = √acc to first order
        half = x.device.type == "cpu" and x.dtype in (torch.float16, torch.bfloat16)
        xc, yc = (x.float(), y.float()) if half else (x, y)
        r = (torch.cdist(xc, yc, p=1.0) if spec.l1 else
             torch.cdist(xc, yc, p=2.0, compute_mode="donot_use_mm_for_euclid_dist").square())
        return r.to(x.dtype)
    x2 = x.pow(2).sum(-1, keepdim=True)
    y2 = y.pow(2).sum(-1).unsqueeze(-2)
    return (x2 + y2 - 2.0 * (x @ y.transpose(-1, -2))).clamp_min(0.0)


def export_distance(x: torch.Tensor, y: torch.Tensor, l1: bool, chunk: int | None = None) -> torch.Tensor:
    """Σ_i |x_i - y_i| (``l1``) or Σ_i (x_i - y_i)² over the features, as a graph of standard ONNX ops with no
    (..., N, M, d) tensor. x: (..., N, d), y: (..., M, d) -> (..., N, M); N and M may be graph sizes.

    The features go in static steps of ``chunk`` (default ``EXPORT_CHUNK``; d is a fixed size per layer),
    each a broadcast (..., chunk, M, N) tensor reduced over its features into an (..., M, N) sum (tokens last:
    every broadcast row is N long). L1 as |a - b| = 2·max(a, b) - a - b: one broadcast op per step instead
    of two (Sub, Abs), Σ_i x_i and Σ_i y_i subtracted once at the end, clamped at 0 (the cancellation's
    rounding, a few ulp of Σ_i |x_i| + |y_i|, may fall below a zero distance). Squared L2 as Σ (x_i - y_i)²
    (no Gram expansion, as the eager composite: docs/DESIGN.md §1.5)."""
    chunk = chunk or EXPORT_CHUNK or x.shape[-1]
    xt = x.transpose(-1, -2).unsqueeze(-2)  # (..., d, 1, N)
    yt = y.transpose(-1, -2).unsqueeze(-1)  # (..., d, M, 1)
    acc = None
    for s in range(0, x.shape[-1], chunk):
        xs, ys = xt[..., s : s + chunk, :, :], yt[..., s : s + chunk, :, :]
        if l1:
            terms = torch.maximum(xs, ys)
        else:
            diff = xs - ys
            terms = diff * diff
        part = _sum_steps(terms)
        acc = part if acc is None else acc + part
    if l1:
        acc = (2.0 * acc - xt.sum(-3) - yt.sum(-3)).clamp_min(0.0)
    return acc.transpose(-1, -2)


def _sum_steps(terms: torch.Tensor) -> torch.Tensor:
    """(..., c, M, N) -> (..., M, N): the sum over the c features of a step, as a product with a row of ones.
    onnxruntime runs that MatMul faster than a ReduceSum over a leading axis (one 65,536 × 49 × 64 distance in
    steps of 8: 217 against 228 ms with 1 thread, 107 against 117 ms with 2; docs/DEPLOY.md)."""
    ones = terms.new_ones(1, terms.shape[-3])
    shape = terms.shape
    # every size from the graph's Shape (batch, heads, M and N stay dynamic); no slice of terms is computed
    return torch.matmul(ones, terms.flatten(-2)).reshape(shape[:-3] + shape[-2:])


def laplace_kernel_composite(x: torch.Tensor, y: torch.Tensor, lam: float, kernel: str = "laplacian") -> torch.Tensor:
    """f(r(x_i, y_j) / lam) of the family ``kernel``.  x: (..., N, d), y: (..., M, d) -> (..., N, M)."""
    return kernel_spec(kernel).kernel_of(pairwise_distance(x, y, kernel), 1.0 / lam)


def laplace_kernel_matmul_composite(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> torch.Tensor:
    """k(X, Y) @ V.  x: (..., N, d), y: (..., M, d), v: (..., M, e) -> (..., N, e)."""
    return laplace_kernel_composite(x, y, lam, kernel) @ v


_GRAD_CHUNK_ELEMS = 1 << 22


def laplace_kernel_grad_composite(
    x: torch.Tensor, y: torch.Tensor, out: torch.Tensor, grad: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of K = f(r / lam) without autograd, given K ``out`` and dL/dK ``grad`` (..., N, M).

    dL/dD = grad · dK/dD for D the accumulated distance (``KernelSpec.slope_of``; D recomputed only when the
    slope needs it); the L1 sign term is summed over row chunks of at most ``_GRAD_CHUNK_ELEMS``
    (chunk, M, d) entries, sign(0) = 0 as in the CPU and Triton paths (docs/DESIGN.md §1, §1.5)."""
    spec = kernel_spec(kernel)
    acc = pairwise_distance(x, y, kernel) if spec.slope_needs_distance else None
    gp = grad * spec.slope_of(acc, out, 1.0 / lam)
    if not spec.l1:
        dx = 2.0 * (gp.sum(-1, keepdim=True) * x - gp @ y)
        dy = 2.0 * (gp.sum(-2).unsqueeze(-1) * y - gp.transpose(-1, -2) @ x)
        return dx, dy
    n, m, d = x.shape[-2], y.shape[-2], x.shape[-1]
    lead = max(1, gp[..., 0, 0].numel())
    step = max(1, _GRAD_CHUNK_ELEMS // max(1, lead * m * d))
    dx = torch.empty_like(x, memory_format=torch.contiguous_format)
    dy = torch.zeros_like(y, memory_format=torch.contiguous_format)
    for s in range(0, n, step):
        part = torch.sign(x[..., s : s + step, None, :] - y[..., None, :, :]) * gp[..., s : s + step, :, None]
        dx[..., s : s + step, :] = part.sum(-2)
        dy -= part.sum(-3)
    return dx, dy


def laplace_kernel_matmul_grad_composite(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, lam: float, kernel: str = "laplacian"
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX, dY, dV) of k(X, Y) @ V without autograd, given dL/dO ``grad`` (..., N, e); recomputes K."""
    c = laplace_kernel_composite(x, y, lam, kernel)
    dv = c.transpose(-1, -2) @ grad
    dx, dy = laplace_kernel_grad_composite(x, y, c, grad @ v.transpose(-1, -2), lam, kernel)
    return dx, dy, dv
