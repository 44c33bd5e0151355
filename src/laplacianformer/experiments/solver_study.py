"""Newton–Schulz vs conjugate gradient on the regularised inverse (DESIGN.md §3, §7 "NS vs CG").

For each family of symmetric positive definite matrices P the study records the residual
||I - P V||_F after k iterations of each solver (V from ``newton_schulz_iterate`` or
``conjugate_gradient_inverse``, the very functions the operator calls), as the median over a batch.

Families:
- ``spd(kappa)``: P = Q diag(λ) Qᵀ, Q random orthogonal, λ geometric from 1 down to 1/kappa (m×m).
- ``landmarks(source, lam)``: P = W + eps·I with W = k(L, L) the Laplacian kernel of landmarks L,
  L = 7×7 average pool of scaled tokens (DESIGN.md §2), tokens either i.i.d. Gaussian ("iid") or a
  spatially smooth random field ("smooth", neighbouring tokens alike, as in real feature maps).
- any extra (batch, m, m) matrices, e.g. W from a trained model's queries (``analyze solver --checkpoint``).

The solvers run in the matrices' dtype (float32 by default, the operator's compute dtype); the residual
is evaluated in float64.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import torch
import torch.nn.functional as F

from ..ops.pooling import pool_landmarks
from ..ops.kernel import laplace_kernel
from ..ops.newton_schulz import conjugate_gradient_inverse, regularise
from ..ops.newton_schulz import newton_schulz_iterate
from .common import markdown_table

SOLVER_FUNCS = {"newton_schulz": newton_schulz_iterate, "cg": conjugate_gradient_inverse}
DEFAULT_ITERS = (1, 2, 3, 4, 5, 6, 8, 10, 12, 15, 20, 25, 30, 40, 50, 60)
TABLE_ITERS = (5, 10, 20, 40)
DEFAULT_KAPPAS = (1e1, 1e2, 1e3, 1e4, 1e5, 1e6)


def spd_with_condition(
    m: int, kappa: float, *, batch: int = 8, generator: torch.Generator | None = None, dtype=torch.float32
) -> torch.Tensor:
    """(batch, m, m) SPD matrices with eigenvalues geometric in [1/kappa, 1] (condition number kappa)."""
    if kappa < 1:
        raise ValueError(f"kappa: expected a condition number >= 1, got {kappa}")
    a = torch.randn(batch, m, m, generator=generator, dtype=torch.float64)
    q, _ = torch.linalg.qr(a)
    lam = torch.logspace(0, -math.log10(kappa), m, dtype=torch.float64)
    p = (q * lam) @ q.transpose(-1, -2)
    return (0.5 * (p + p.transpose(-1, -2))).to(dtype)


def smooth_tokens(batch: int, heads: int, hw: tuple[int, int], d: int, *, generator=None, noise: float = 0.1) -> torch.Tensor:
    """(batch, heads, h·w, d) tokens of a smooth random field: a 4×4 Gaussian grid upsampled, plus small noise."""
    h, w = hw
    coarse = torch.randn(batch * heads, d, 4, 4, generator=generator)
    field = F.interpolate(coarse, size=(h, w), mode="bicubic", align_corners=True)
    field = field + noise * torch.randn(field.shape, generator=generator)
    return field.flatten(2).transpose(1, 2).reshape(batch, heads, h * w, d)


def landmark_matrices(
    source: str,
    *,
    lam: float = 4.0,
    d: int = 32,
    hw: tuple[int, int] = (28, 28),
    grid: tuple[int, int] = (7, 7),
    batch: int = 8,
    eps: float = 0.01,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(batch, m, m) P = k(L, L) + eps·I for landmarks pooled from synthetic d-dim tokens scaled by d**-0.5."""
    if source == "iid":
        tokens = torch.randn(batch, 1, hw[0] * hw[1], d, generator=generator)
    elif source == "smooth":
        tokens = smooth_tokens(batch, 1, hw, d, generator=generator)
    else:
        raise ValueError(f"source: expected 'iid' or 'smooth', got {source!r}")
    marks = pool_landmarks(tokens * d**-0.5, hw, grid)
    return regularise(laplace_kernel(marks, marks, lam, "laplacian"), eps)[:, 0]


def residual_curve(p: torch.Tensor, solver: str, iters: Sequence[int]) -> list[float]:
    """Median over the batch of ||I - P V_k||_F (float64) for each k in ``iters``.  p: (batch, m, m)."""
    func = SOLVER_FUNCS[solver]
    eye = torch.eye(p.shape[-1], dtype=torch.float64)
    out = []
    for k in iters:
        v = func(p, k)
        res = torch.linalg.matrix_norm(eye - p.double() @ v.double())
        res = torch.where(torch.isfinite(res), res, torch.full_like(res, math.inf))
        out.append(float(res.median()))
    return out


def condition_numbers(p: torch.Tensor) -> list[float]:
    """2-norm condition number of each matrix (float64 eigenvalues).  p: (batch, m, m)."""
    ev = torch.linalg.eigvalsh(p.double())
    return (ev[..., -1] / ev[..., 0].clamp_min(1e-300)).tolist()


def standard_families(
    *, m: int = 49, kappas: Sequence[float] = DEFAULT_KAPPAS, lams: Sequence[float] = (1.0, 4.0, 8.0),
    batch: int = 8, seed: int = 0, dtype=torch.float32,
) -> dict[str, torch.Tensor]:
    """The synthetic SPD and synthetic-landmark families, name -> (batch, m, m)."""
    gen = torch.Generator().manual_seed(seed)
    fams = {f"spd kappa=1e{round(math.log10(k))}": spd_with_condition(m, k, batch=batch, generator=gen, dtype=dtype) for k in kappas}
    side = round(math.sqrt(m))
    for source in ("iid", "smooth"):
        for lam in lams:
            p = landmark_matrices(source, lam=lam, grid=(side, side), batch=batch, generator=gen)
            fams[f"W {source} tokens lam={lam:g}"] = p.to(dtype)
    return fams


def run_solver_study(families: Mapping[str, torch.Tensor], iters: Sequence[int] = DEFAULT_ITERS, progress: bool = True) -> dict:
    """Residual curves for every family and solver.  Returns a JSON-ready dict."""
    from tqdm.auto import tqdm

    results = []
    for name, p in tqdm(list(families.items()), desc="solver study", disable=not progress):
        cond = condition_numbers(p)
        entry = {
            "name": name,
            "m": p.shape[-1],
            "batch": p.shape[0],
            "dtype": str(p.dtype).replace("torch.", ""),
            "cond_median": float(torch.tensor(cond).median()),
            "residual": {s: residual_curve(p, s, iters) for s in SOLVER_FUNCS},
        }
        results.append(entry)
    return {"iters": list(iters), "families": results}


def _at(entry: dict, iters: Sequence[int], solver: str, k: int) -> float:
    return entry["residual"][solver][list(iters).index(k)]


def solver_table(study: dict, table_iters: Sequence[int] = TABLE_ITERS) -> str:
    """Markdown: one row per family, median residual of NS and CG at the chosen iteration counts."""
    iters = study["iters"]
    table_iters = [k for k in table_iters if k in iters]
    header = ["matrices", "cond(P) median"] + [f"NS@{k}" for k in table_iters] + [f"CG@{k}" for k in table_iters]
    rows = []
    for e in study["families"]:
        row = [e["name"], f"{e['cond_median']:.3g}"]
        row += [f"{_at(e, iters, 'newton_schulz', k):.2e}" for k in table_iters]
        row += [f"{_at(e, iters, 'cg', k):.2e}" for k in table_iters]
        rows.append(row)
    return markdown_table(header, rows)


def plot_solver_study(study: dict, path) -> None:
    """Residual vs iterations, NS solid and CG dashed; one panel for synthetic SPD, one for landmark matrices."""
    from .common import pyplot

    plt = pyplot()
    groups = {
        "synthetic SPD (cond = kappa)": [e for e in study["families"] if e["name"].startswith("spd")],
        "landmark kernel matrices W + 0.01 I": [e for e in study["families"] if not e["name"].startswith("spd")],
    }
    groups = {k: v for k, v in groups.items() if v}
    fig, axes = plt.subplots(1, len(groups), figsize=(6.5 * len(groups), 4.8), squeeze=False)
    cmap = plt.get_cmap("viridis")
    for ax, (title, entries) in zip(axes[0], groups.items()):
        for i, e in enumerate(entries):
            color = cmap(i / max(1, len(entries) - 1))
            label = f"{e['name']} (cond {e['cond_median']:.2g})"
            ax.semilogy(study["iters"], e["residual"]["newton_schulz"], "-", color=color, label="NS " + label)
            ax.semilogy(study["iters"], e["residual"]["cg"], "--", color=color)
        ax.set_title(title + "\nsolid: Newton–Schulz, dashed: CG")
        ax.set_xlabel("iterations")
        ax.set_ylabel("median ||I - P V||_F")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
