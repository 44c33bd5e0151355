"""Ill-conditioned and degenerate inputs shared by the robustness tests and ``benchmarks/robustness.py``.

- ``landmark_kernel_with_condition(kappa)``: the Laplacian kernel matrix W = k(L, L) of landmarks on a
  regular side×side grid (the layout adaptive pooling produces, DESIGN.md §2), with the grid spacing found
  by bisection so that cond(W) = kappa. Shrinking the spacing makes landmarks near-duplicates.
- ``attention_inputs(case, ...)``: (q, k, v) for the end-to-end cases (random, all-equal tokens,
  near-duplicate landmarks, two clusters, huge and tiny scales).
"""

from __future__ import annotations

import math

import torch

from laplacianformer.ops.kernel import laplace_kernel_naive

CONDITION_NUMBERS = (1e1, 1e2, 1e4, 1e6, 1e8)
CASES = ("random", "all_equal", "near_duplicate_landmarks", "two_clusters", "scale_1e4", "scale_1e-6")


def grid_landmarks(spacing: float, side: int = 7, d: int = 4) -> torch.Tensor:
    """side² landmarks on a square grid with the given spacing in the first two of d dims.  -> (side², d) fp64."""
    axis = torch.arange(side, dtype=torch.float64) * spacing
    yy, xx = torch.meshgrid(axis, axis, indexing="ij")
    marks = torch.zeros(side * side, d, dtype=torch.float64)
    marks[:, 0], marks[:, 1] = yy.flatten(), xx.flatten()
    return marks


def landmark_kernel_with_condition(kappa: float, side: int = 7, lam: float = 4.0) -> torch.Tensor:
    """W (side², side²) fp64, the grid Laplacian kernel matrix with cond(W) = kappa (rel. error < 1e-6)."""
    lo, hi = math.log(1e-12), math.log(1e3)
    best, best_gap = None, math.inf
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        marks = grid_landmarks(math.exp(mid), side)
        w = laplace_kernel_naive(marks, marks, lam)
        cond = torch.linalg.cond(w).item()
        if abs(cond / kappa - 1) < best_gap:
            best, best_gap = w, abs(cond / kappa - 1)
        if best_gap < 1e-7:
            break
        if cond > kappa:
            lo = mid
        else:
            hi = mid
    return best


def attention_inputs(case: str, b: int = 2, h: int = 2, hw: tuple[int, int] = (8, 8), d: int = 16, seed: int = 0):
    """(q, k, v), each (b, h, N, d) float64, N = hw[0]·hw[1], for one of ``CASES``."""
    g = torch.Generator().manual_seed(seed)
    n = hw[0] * hw[1]

    def randn(*shape):
        return torch.randn(*shape, generator=g, dtype=torch.float64)

    v = randn(b, h, n, d)
    if case == "random":
        return randn(b, h, n, d), randn(b, h, n, d), v
    if case == "all_equal":
        x = randn(b, h, 1, d).expand(b, h, n, d).contiguous()
        return x, x.clone(), v
    if case == "near_duplicate_landmarks":
        x = randn(b, h, 1, d) + 1e-9 * randn(b, h, n, d)
        return x, x + 1e-9 * randn(b, h, n, d), v
    if case == "two_clusters":
        centres = randn(b, h, 2, d)
        left = torch.arange(n) % hw[1] < hw[1] // 2
        x = torch.where(left[None, None, :, None], centres[:, :, :1], centres[:, :, 1:]) + 1e-7 * randn(b, h, n, d)
        return x, x.flip(2), v
    if case == "scale_1e4":
        return 1e4 * randn(b, h, n, d), 1e4 * randn(b, h, n, d), v
    if case == "scale_1e-6":
        return 1e-6 * randn(b, h, n, d), 1e-6 * randn(b, h, n, d), v
    raise ValueError(f"case: expected one of {list(CASES)}, got {case!r}")


def relative_error(out: torch.Tensor, ref: torch.Tensor) -> float:
    """||out - ref||_F / ||ref||_F in float64 (the absolute error when ref is zero)."""
    out, ref = out.double(), ref.double()
    den = ref.norm().item()
    err = (out - ref).norm().item()
    return err / den if den > 0 else err


def solver_report(w: torch.Tensor, *, solver: str, eps: float, iters: int, dtype: torch.dtype) -> dict:
    """Solve (W + eps·I)^{-1} in ``dtype``; measure it against the float64 inverse.

    w: (m, m) float64.  Keys: finite, residual ||I - P V||_F (float64), rel_err vs inv(P),
    norm_ratio ||V||_2 / ||P^{-1}||_2 (<= 1 means the unconverged iterate damps, never amplifies).
    """
    from laplacianformer.ops.newton_schulz import regularise, regularised_inverse

    p = regularise(w, eps)
    try:
        v = regularised_inverse(w.to(dtype), solver=solver, iters=iters, eps=eps).double()
    except RuntimeError as exc:
        return {"finite": False, "error": f"{type(exc).__name__}: {str(exc)[:80]}"}
    finite = bool(torch.isfinite(v).all())
    exact = torch.linalg.inv(p)
    eye = torch.eye(w.shape[-1], dtype=torch.float64)
    return {
        "finite": finite,
        "residual": torch.linalg.matrix_norm(eye - p @ v).item() if finite else float("nan"),
        "rel_err": relative_error(v, exact) if finite else float("nan"),
        "norm_ratio": (torch.linalg.matrix_norm(v, 2) / torch.linalg.matrix_norm(exact, 2)).item() if finite else float("nan"),
    }


def attention_report(
    case: str, *, dtype: torch.dtype, norm: str = "injective", solver: str = "newton_schulz", iters: int = 20,
    kernel: str = "laplacian", hw: tuple[int, int] = (8, 8), landmarks=(4, 4), backward: bool = True,
) -> dict:
    """Run ``laplacian_attention`` on a case in ``dtype`` (forward and backward).

    Keys: finite (output), finite_grad (q, k, v gradients), residual (max solver residual from
    ``return_stats``), rel_err vs the float64 run of the same call with the exact solver, rel_err_exact_kernel
    vs the float64 exact O(N²) kernel (landmarks=None).
    """
    from laplacianformer import laplacian_attention

    q, k, v = attention_inputs(case, hw=hw)
    kw = dict(hw=hw, norm=norm, kernel=kernel)
    ins = [t.to(dtype).requires_grad_(backward) for t in (q, k, v)]
    out, stats = laplacian_attention(*ins, landmarks=landmarks, solver=solver, iters=iters, return_stats=True, **kw)
    report = {"finite": bool(torch.isfinite(out).all()), "residual": float(stats["residual"].max())}
    if backward:
        out.float().square().sum().backward()
        report["finite_grad"] = all(bool(torch.isfinite(t.grad).all()) for t in ins)
    with torch.no_grad():
        ref = laplacian_attention(q, k, v, landmarks=landmarks, solver="exact", **kw)
        dense = laplacian_attention(q, k, v, landmarks=None, **kw)
    report["rel_err"] = relative_error(out.detach(), ref)
    report["rel_err_exact_kernel"] = relative_error(out.detach(), dense)
    return report
