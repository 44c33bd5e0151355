"""``laplacianformer kernels why``: what each kernel family's model feeds its kernel, and how well the Nyström
factors fit it (docs/DESIGN.md §7.8, "Why"; issue 41, item 3).

One model per family (``choose_models``): the study's cell at the family's λ selected on validation, seed 0;
while that family's selection is incomplete, the cell at its matched λ. A cell not trained yet, or whose run
directory is not on this machine (runs/ is not committed), gives way to the family's trained cell nearest in
log λ, and the record says so. ``--init``: the protocol's model at initialisation at the matched λ instead.
On each model:

- distances (``stage_distances``, ``distance_summary``): per stage, the L1 and L2 distances between the
  queries and what the kernel compares them with (the pooled landmarks on a Nyström stage, the keys on an
  exact one), on q scaled by the layer's qk_scale; the family's own r, r / λ and the kernel values;
  quantiles and two tail indices (q99 / q50 and Hill's estimator);
- the Nyström error (``nystrom_errors``): ‖G − Ĝ‖_F / ‖G‖_F on stage 1 at 196, 1,024 and 4,096 tokens
  (28, 64 and 128 px images: the micro model's stem stride 2), G the exact kernel matrix of the layer's
  scaled q and k, Ĝ = C_q (W + εI)⁻¹ C_kᵀ with the layer's solver and ε, and with the exact inverse;
- the ranking (``ranking``): the study's (validation, then test) against the order the heavy-tail argument
  predicts.

Writes OUT/why.json, why.md, <family>.png and nystrom.png (default OUT results/kernels/why, with --init
results/kernels/why/init). ``experiments/kernels.py`` hands over what it knows of the study (``Study``): it
imports this module, not the reverse.
"""

from __future__ import annotations

import argparse
import math
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..ops.attention import pool_landmarks
from ..ops.kernel import laplace_kernel
from ..ops.kernel.composite import pairwise_distance
from ..ops.kernel_families import SHIPPED, kernel_spec
from ..ops.newton_schulz import regularised_inverse
from .analysis import capture_qk
from .common import environment, jsonable, markdown_table, pyplot, read_json, run_command, write_json

DEFAULT_OUT = "results/kernels/why"
INIT_SUBDIR = "init"
STUDY_OUT = "results/kernels"
KERNEL_RUNS = "runs/kernels"
ACCURACY_RUNS = "runs/accuracy"
SEED = 0
QUANTILES = (0.05, 0.25, 0.5, 0.75, 0.95)
TAIL_Q = 0.99
HILL_FRACTION = 0.02
"""Hill's estimator reads the top 2 % of the distances (k = 0.02·n order statistics)."""
SIZES = (28, 64, 128)
"""Image sides of the Nyström error: 14², 32² and 64² stage-1 tokens with the micro model's stem stride 2."""
DIST_IMAGES, NYSTROM_IMAGES = 64, 8
DEAD = 1e-3
"""A kernel value below this counts as a pair the kernel has switched off (``below_1e-3``)."""
_SAMPLE = 1_000_000  # torch.quantile's input limit is 16 M; a seeded subset above this size


@dataclass(frozen=True)
class Study:
    """What this module reads of the kernel study (``experiments/kernels.py`` builds it: ``why_study``).

    matched: family -> matched λ; label(family, λ) -> the cell label; configuration(label) -> (attn,
    attn_kwargs); selection(cells record, head dim) and confirmation(cells record, selection) -> the
    study's dicts; head_dim(protocol) -> d."""

    matched: Mapping[str, float]
    label: Callable[[str, float], str]
    configuration: Callable[[str], tuple]
    selection: Callable[[dict, int], dict]
    confirmation: Callable[[dict, dict], dict]
    head_dim: Callable[[dict], int]


# --- which models -------------------------------------------------------------------------------------------


def kernel_run_dir(runs: Path, label: str, seed: int) -> Path:
    """A kernel-study cell's run directory (``kernels.run_cells``: '@' -> '-', then -s<seed>)."""
    return Path(runs) / f"{label.replace('@', '-')}-s{seed}"


def accuracy_run_dir(runs: Path, label: str, seed: int) -> Path:
    """An accuracy-study cell's run directory (``accuracy.run_cells``: <label>-s<seed>)."""
    return Path(runs) / f"{label}-s{seed}"


def cell_run_dir(cell: dict, runs: Path, accuracy_runs: Path) -> Path:
    """Where a recorded cell's weights are: its own run directory, or the accuracy study's for a cell reused
    from there (``reused_from`` = "<cells.json>#<label>|seed=<s>")."""
    if cell.get("reused_from"):
        key = cell["reused_from"].rpartition("#")[2]
        return accuracy_run_dir(accuracy_runs, key.split("|seed=")[0], int(cell["seed"]))
    return kernel_run_dir(runs, cell["label"], int(cell["seed"]))


def _weights(run_dir: Path) -> Path | None:
    """The run's final weights (``model.safetensors``: what the cell's val and test top-1 score), else None."""
    from ..hub import WEIGHTS_NAME

    file = Path(run_dir) / WEIGHTS_NAME
    return file if file.is_file() else None


def _lam_of(label: str) -> float | None:
    _, sep, lam = label.partition("@lam=")
    return float(lam) if sep else None


def choose_models(record: dict | None, sel: dict | None, families: Sequence[str], study: Study, runs: Path,
                  accuracy_runs: Path, seed: int = SEED, lams: Mapping[str, float] | None = None) -> dict[str, dict]:
    """Per family the cell to analyse: ``{family, lam, seed, label, basis, wanted, stand_in, run_dir, weights,
    val_top1, test_top1}``, or ``{family, basis, wanted, missing}`` when no trained cell of the family has
    its weights here. ``basis``: the λ given in ``lams``, else the selected λ when the family's selection is
    complete, else the matched λ.
    The wanted cell (that λ, ``seed``) comes first, then the family's other finished cells by distance in
    log λ, then seed; a replacement is marked ``stand_in`` with the reason."""
    cells = (record or {}).get("cells", {})
    out = {}
    for family in families:
        fam = (sel or {}).get("families", {}).get(family)
        if family in (lams or {}):
            lam, basis = float(lams[family]), "λ given (--lam)"
        elif fam and fam.get("complete") and fam.get("selected_lam") is not None:
            lam, basis = float(fam["selected_lam"]), "λ selected on validation"
        else:
            lam, basis = float(study.matched[family]), "matched λ (this family's selection is not complete)"
        wanted = study.label(family, lam)
        done = [c for c in cells.values() if c.get("attn") == family and c.get("val_top1") is not None
                and _lam_of(c["label"]) is not None]
        done.sort(key=lambda c: (abs(math.log(_lam_of(c["label"]) / lam)), c["seed"] != seed, c["seed"],
                                 _lam_of(c["label"])))
        reason = None
        if not any(c["label"] == wanted and c["seed"] == seed for c in done):
            reason = f"{wanted} seed {seed} is not trained yet"
        chosen = None
        for c in done:
            run_dir = cell_run_dir(c, runs, accuracy_runs)
            if _weights(run_dir) is not None:
                chosen = (c, run_dir)
                break
            if c["label"] == wanted and c["seed"] == seed:
                reason = f"{wanted} seed {seed}: no weights in {run_dir} (not on this machine)"
        entry = {"family": family, "basis": basis, "wanted": {"label": wanted, "seed": seed}}
        if chosen is None:
            out[family] = {**entry, "missing": reason or f"no trained {family} cell has its weights here"}
            continue
        c, run_dir = chosen
        same = c["label"] == wanted and c["seed"] == seed
        out[family] = {**entry, "label": c["label"], "lam": _lam_of(c["label"]), "seed": c["seed"],
                       "stand_in": None if same else reason, "run_dir": str(run_dir),
                       "weights": str(_weights(run_dir)), "reused_from": c.get("reused_from"),
                       "val_top1": c.get("val_top1"), "test_top1": c.get("test_top1")}
    return out


def load_model(entry: dict) -> torch.nn.Module:
    """The final weights of a chosen cell (``choose_models``) in eval mode, checked to be the family and λ
    the record says."""
    from ..hub import from_pretrained

    model = from_pretrained(entry["weights"]).eval()
    _check_settings(model, entry["family"], entry["lam"], entry["weights"])
    return model


def init_model(protocol: dict, family: str, lam: float, study: Study, in_chans: int, seed: int = SEED) -> torch.nn.Module:
    """The protocol's model with ``family`` at ``lam`` (the study's cell settings), at initialisation
    (``torch.manual_seed(seed)``), in eval mode."""
    from ..models import create_model
    from ..train.geometry import model_kwargs_for
    from .protocol import cell_attn_kwargs

    rec = protocol["recipe"]
    attn, kwargs = study.configuration(study.label(family, lam))
    torch.manual_seed(seed)
    model = create_model(rec["model"], num_classes=10, in_chans=in_chans, attn=attn,
                         attn_kwargs=cell_attn_kwargs(attn, kwargs), **model_kwargs_for(rec.get("model_kwargs"), rec["img_size"]))
    _check_settings(model, family, lam, "init")
    return model.eval()


def _check_settings(model: torch.nn.Module, family: str, lam: float, where: str) -> None:
    from ..layers import LaplacianAttention

    for m in model.modules():
        if isinstance(m, LaplacianAttention):
            if m.settings.kernel != family or not math.isclose(m.settings.lam, lam, rel_tol=1e-6):
                raise ValueError(f"run: {where} holds kernel={m.settings.kernel!r} lam={m.settings.lam:g}, "
                                 f"the record says {family!r} lam={lam:g}")


def protocol_images(data: str, size: int, n: int, seed: int = SEED) -> torch.Tensor:
    """A seeded subset (``seed``) of ``n`` test images of ``data`` at ``size`` px, normalised: (n, C, size, size).
    The same ``n`` and ``seed`` pick the same images at every size."""
    from ..data import build_eval_dataset
    from ..train.augment import normalize

    test = build_eval_dataset(data, size, test_subset=n, seed=seed)
    return normalize(test.images, test.mean, test.std)


# --- distances and kernel values ----------------------------------------------------------------------------


def stage_distances(records: list[dict]) -> list[dict]:
    """Per stage (the distinct token grids of ``capture_qk``'s records, in call order): the L1 and L2
    distances (flat, float64) between the scaled queries and the pooled landmarks (a Nyström stage) or the
    keys (an exact stage: the landmarks cover every token), over the stage's layers, images and heads;
    also the layers' names, the grid, the pairs' kind and the family and λ (one per model, else ValueError)."""
    stages: dict[tuple, dict] = {}
    for r in records:
        s = r["settings"]
        q = r["q"].double()
        if r["landmarks"] is None:
            y, pairs = r["k"].double(), "query–key (exact stage)"
        else:
            y = pool_landmarks(q, r["hw"], r["landmarks"])
            pairs = f"query–landmark ({r['landmarks'][0]}×{r['landmarks'][1]} pooled)"
        st = stages.setdefault(tuple(r["hw"]), {"stage": len(stages) + 1, "hw": list(r["hw"]), "pairs": pairs,
                                                "modules": [], "kernel": s["kernel"], "lam": float(s["lam"]),
                                                "qk_scale": float(s["qk_scale"]), "l1": [], "l2": []})
        if (s["kernel"], float(s["lam"])) != (st["kernel"], st["lam"]):
            raise ValueError(f"model: its layers use different kernels or bandwidths ({r['name']})")
        st["modules"].append(r["name"])
        st["l1"].append(torch.cdist(q, y, p=1.0).flatten())
        st["l2"].append(torch.cdist(q, y, p=2.0, compute_mode="donot_use_mm_for_euclid_dist").flatten())
    for st in stages.values():
        st["l1"], st["l2"] = torch.cat(st["l1"]), torch.cat(st["l2"])
    return list(stages.values())


def _sample(x: torch.Tensor) -> torch.Tensor:
    x = x.flatten()
    if x.numel() <= _SAMPLE:
        return x
    return x[torch.randperm(x.numel(), generator=torch.Generator().manual_seed(0))[:_SAMPLE]]


def quantiles(x: torch.Tensor, qs: Sequence[float] = QUANTILES) -> dict[str, float]:
    """{"5": q05, "25": ...} of the flat ``x`` (a seeded subset above 1 M values)."""
    vals = torch.quantile(_sample(x).double(), torch.tensor(qs, dtype=torch.float64)).tolist()
    return {f"{100 * q:g}": v for q, v in zip(qs, vals)}


def hill_alpha(x: torch.Tensor, fraction: float = HILL_FRACTION) -> float:
    """Hill's estimator of the tail exponent α (P(X > x) ~ x^−α) from the top k = ``fraction``·n values:
    1 / mean(log(x_(i) / x_(k+1))), i = 1..k. Small α (≲ 4) is a heavy, power-law tail; a light tail
    (exponential or thinner) gives large values that keep growing as the fraction shrinks."""
    x = x.flatten().double()
    k = max(int(fraction * x.numel()), 2)
    if x.numel() < k + 1:
        raise ValueError(f"x: Hill's estimator needs more than {k} values, got {x.numel()}")
    top = torch.topk(x, k + 1).values
    if top[k] <= 0:
        return math.inf
    return float(1.0 / torch.log(top[:k] / top[k]).mean())


def _tail(x: torch.Tensor) -> dict:
    q = torch.quantile(_sample(x).double(), torch.tensor([0.5, TAIL_Q], dtype=torch.float64)).tolist()
    return {"q": quantiles(x), "q99_over_q50": q[1] / q[0], "hill_alpha": hill_alpha(x)}


def distance_summary(stage: dict) -> dict:
    """The JSON of one ``stage_distances`` entry: quantiles and tail indices of L1 and L2, quantiles of the
    family's own r / λ, and of the kernel values k = f(r / λ) with the share below ``DEAD`` and the tail
    retention k(r₉₅) / k(r₅₀) (= the kernel's 5 % quantile over its median: how much of the median pair's
    weight a pair at the 95th distance percentile keeps)."""
    spec = kernel_spec(stage["kernel"])
    own = {"l1": stage["l1"], "l2": stage["l2"], "sq_l2": stage["l2"].square()}[spec.distance]
    u = own / stage["lam"]
    k = spec.profile(u)
    kq = quantiles(k)
    return {key: stage[key] for key in ("stage", "hw", "pairs", "modules", "kernel", "lam", "qk_scale")} | {
        "tokens": stage["hw"][0] * stage["hw"][1], "count": int(own.numel()), "distance": spec.distance,
        "l1": _tail(stage["l1"]), "l2": _tail(stage["l2"]), "r_over_lam": {"q": quantiles(u)},
        "kernel": {"q": kq, "mean": float(k.mean()), f"below_{DEAD:g}": float((k < DEAD).double().mean()),
                   "tail_retention": kq["5"] / kq["50"] if kq["50"] > 0 else None}}


# --- the Nyström error --------------------------------------------------------------------------------------


def _stats(values: list[float]) -> dict:
    t = torch.tensor(values, dtype=torch.float64)
    return {"mean": float(t.mean()), "std": float(t.std()) if t.numel() > 1 else None, "min": float(t.min()),
            "max": float(t.max()), "n": t.numel(), "values": values}


@torch.no_grad()
def nystrom_error(record: dict) -> dict | None:
    """‖G − Ĝ‖_F / ‖G‖_F of one captured layer (``capture_qk``) per image and head (flat lists), G = k(Q, K)
    exact (N×N) on the scaled q and k, Ĝ = C_q P⁻¹ C_kᵀ with C_q = k(Q, L), C_k = k(K, L), P = W + εI, W = k(L, L)
    and L the layer's pooled landmarks (DESIGN.md §2, §3): P⁻¹ by the layer's solver (``"solver"``) and
    exactly (``"exact"``). None for an exact layer. float64, one image at a time (G is N² per head)."""
    if record["landmarks"] is None:
        return None
    s = record["settings"]
    lam, kind = float(s["lam"]), s["kernel"]
    q, k = record["q"].double(), record["k"].double()
    marks = pool_landmarks(q, record["hw"], record["landmarks"])
    w = laplace_kernel(marks, marks, lam, kind)
    inv = {"solver": regularised_inverse(w, solver=s["solver"], iters=s["iters"], eps=s["ns_eps"]),
           "exact": regularised_inverse(w, solver="exact", eps=s["ns_eps"])}
    out = {key: [] for key in inv}
    for b in range(q.shape[0]):
        g = laplace_kernel(q[b], k[b], lam, kind)
        c_q, c_k = laplace_kernel(q[b], marks[b], lam, kind), laplace_kernel(k[b], marks[b], lam, kind)
        norm = g.flatten(-2).norm(dim=-1)
        for key, p_inv in inv.items():
            err = (g - c_q @ p_inv[b] @ c_k.transpose(-1, -2)).flatten(-2).norm(dim=-1) / norm
            out[key] += err.tolist()
    return out


def nystrom_errors(model: torch.nn.Module, images: Mapping[int, torch.Tensor]) -> list[dict]:
    """Per image size of ``images`` (size -> normalised images): the stage-1 layers' Nyström errors
    (``nystrom_error``), pooled over layers, images and heads: mean, std, min, max and the values."""
    rows = []
    for size, x in images.items():
        recs = capture_qk(model, x)
        stage1 = [r for r in recs if r["hw"] == recs[0]["hw"]]
        errs = {"solver": [], "exact": []}
        for r in stage1:
            e = nystrom_error(r)
            for key in errs:
                errs[key] += [] if e is None else e[key]
        s = stage1[0]["settings"]
        h, w = stage1[0]["hw"]
        rows.append({"img_size": size, "hw": [h, w], "tokens": h * w, "images": int(x.shape[0]),
                     "modules": [r["name"] for r in stage1],
                     "landmarks": None if stage1[0]["landmarks"] is None else list(stage1[0]["landmarks"]),
                     "solver": s["solver"], "iters": s["iters"], "eps": s["ns_eps"],
                     "error": _stats(errs["solver"]) if errs["solver"] else None,
                     "error_exact_inverse": _stats(errs["exact"]) if errs["exact"] else None})
    return rows


# --- the ranking --------------------------------------------------------------------------------------------


def _spearman(a: Sequence[str], b: Sequence[str]) -> float | None:
    """Spearman's ρ of two orders of the same items (no ties); None below 3 items."""
    common = [x for x in a if x in b]
    n = len(common)
    if n < 3:
        return None
    ra = {x: i for i, x in enumerate(x for x in a if x in common)}
    rb = {x: i for i, x in enumerate(x for x in b if x in common)}
    return 1.0 - 6.0 * sum((ra[x] - rb[x]) ** 2 for x in common) / (n * (n * n - 1))


def ranking(sel: dict | None, conf: dict | None, distances: Mapping[str, list[dict]]) -> dict:
    """The study's ranking of the families against the heavy-tail prediction.

    Premise: per family, stage 1's L1 and L2 tail indices (is the L1 distance the heavier-tailed one?).
    Prediction: the families ordered by the stage-1 tail retention k(r₉₅) / k(r₅₀) of their analysed model,
    highest first (a kernel that keeps the far pairs' weight is what the argument credits the Laplacian
    with). Measured: the mean validation top-1 at each family's selected λ (when every family's selection is
    complete) and the mean test top-1 of the confirmation (when complete); Spearman's ρ of each with the
    prediction; the Laplacian against the Gaussian on both."""
    retention = {f: st[0]["kernel"]["tail_retention"] for f, st in distances.items() if st}
    predicted = sorted(retention, key=lambda f: -retention[f])
    premise = {f: {f"{d}_{k}": st[0][d][k] for d in ("l1", "l2") for k in ("q99_over_q50", "hill_alpha")}
               for f, st in distances.items() if st}
    out = {"premise": premise,
           "prediction": {"rule": "stage-1 tail retention k(r95)/k(r50), highest first", "order": predicted,
                          "tail_retention": retention}}
    fams = (sel or {}).get("families", {})
    if not sel or not sel.get("complete"):
        done = sorted(f for f, e in fams.items() if e.get("complete"))
        out["validation"] = {"status": f"not yet known: the selection is incomplete (complete: {done or 'none'})"}
    else:
        val = {f: e["lambdas"][f"{e['selected_lam']:g}"]["mean"] for f, e in fams.items()}
        order = sorted(val, key=lambda f: -val[f])
        out["validation"] = {"status": "complete", "mean_top1": val, "selected_lam": {f: e["selected_lam"] for f, e in fams.items()},
                             "order": order, "spearman_with_prediction": _spearman(predicted, order),
                             "laplacian_above_gaussian": val.get("laplacian", 0) > val.get("gaussian", 0)
                             if "laplacian" in val and "gaussian" in val else None}
    if not conf or not conf.get("complete"):
        out["test"] = {"status": "not yet known: the confirmation is incomplete" if conf else
                       "not yet known: no confirmation yet"}
    else:
        test = {f: conf["configurations"][lb]["mean"] for f, lb in conf["chosen"].items()}
        order = sorted(test, key=lambda f: -test[f])
        pair = next((p for p in conf["pairs"] if p["family"] == "gaussian" and p["b"] == "laplacian_default"), None)
        out["test"] = {"status": "complete", "mean_top1": test, "order": order,
                       "spearman_with_prediction": _spearman(predicted, order),
                       "gaussian_minus_laplacian_default": None if pair is None else
                       {k: pair[k] for k in ("n", "mean", "ci95", "verdict")}}
    return out


# --- reports ------------------------------------------------------------------------------------------------


def _plot_family(path: Path, family: str, stages: list[dict], summaries: list[dict], title: str) -> None:
    """One row per stage: r / λ (the family's own distance) with the profile f over it, the tails of L1 and L2
    (P(r / median > x)), the kernel values."""
    spec = kernel_spec(family)
    plt = pyplot()
    fig, axes = plt.subplots(len(stages), 3, figsize=(12, 2.6 * len(stages)), squeeze=False)
    for row, (st, sm) in zip(axes, zip(stages, summaries)):
        own = {"l1": st["l1"], "l2": st["l2"], "sq_l2": st["l2"].square()}[spec.distance]
        u = _sample(own / st["lam"]).float()
        hi = float(torch.quantile(u, 0.999))
        row[0].hist(u.clamp_max(hi).numpy(), bins=60, range=(0, hi), density=True, color="tab:blue", alpha=0.7,
                    histtype="stepfilled")
        twin = row[0].twinx()
        grid = torch.linspace(0, hi, 200)
        twin.plot(grid.numpy(), spec.profile(grid).numpy(), "k-", lw=1, label="profile f(u), right axis")
        twin.set_ylim(0, 1.05)
        twin.legend(fontsize=6, loc="upper right")
        twin.tick_params(labelsize=6)
        row[0].set_xlabel(f"u = r / λ  (r: {spec.distance}, λ = {st['lam']:g})", fontsize=7)
        row[0].set_ylabel("density", fontsize=7)
        row[0].set_title(f"stage {st['stage']}: {st['hw'][0]}×{st['hw'][1]} tokens, {st['pairs']}", fontsize=8)
        for key, label, color in (("l1", "L1", "tab:red"), ("l2", "L2", "tab:green")):
            x = _sample(st[key]).double()
            x = (x / x.median()).sort().values
            surv = 1.0 - torch.arange(x.numel(), dtype=torch.float64) / x.numel()
            row[1].semilogy(x.numpy(), surv.numpy(), color=color,
                            label=f"{label}: q99/q50 {sm[key]['q99_over_q50']:.2f}, Hill α {sm[key]['hill_alpha']:.1f}")
        row[1].set_xlabel("distance / its median", fontsize=7)
        row[1].set_ylabel("P(X > x)", fontsize=7)
        row[1].set_ylim(max(0.5 / _sample(st["l1"]).numel(), 1e-7), 1.5)
        row[1].legend(fontsize=6)
        row[1].set_title("tails of L1 and L2", fontsize=8)
        k = _sample(spec.profile(own / st["lam"])).double()
        row[2].hist(k.clamp_min(1e-8).log10().numpy(), bins=64, range=(-8, 0), density=True, color="tab:purple",
                    alpha=0.8, histtype="stepfilled")
        row[2].set_xlabel("log10 k (kernel value; below 1e-8 at -8)", fontsize=7)
        row[2].set_ylabel("density", fontsize=7)
        ret = sm["kernel"]["tail_retention"]
        row[2].set_title(f"kernel values: median {sm['kernel']['q']['50']:.3g}, k(r95)/k(r50) "
                         f"{'–' if ret is None else f'{ret:.3g}'}", fontsize=8)
        for ax in row:
            ax.tick_params(labelsize=6)
            ax.grid(True, alpha=0.3)
    fig.suptitle(title, fontsize=9)
    fig.subplots_adjust(left=0.06, right=0.95, bottom=0.18 / len(stages), top=1 - 0.22 / len(stages), wspace=0.35,
                        hspace=0.55)  # tight_layout costs seconds per figure
    fig.savefig(path, dpi=100)
    plt.close(fig)


def _plot_nystrom(path: Path, nystrom: Mapping[str, list[dict]], title: str) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for family, rows in nystrom.items():
        rows = [r for r in rows if r["error"] is not None]
        if not rows:
            continue
        toks = [r["tokens"] for r in rows]
        line = ax.errorbar(toks, [r["error"]["mean"] for r in rows], yerr=[r["error"]["std"] or 0 for r in rows],
                           fmt="o-", ms=4, capsize=3, label=f"{family} ({rows[0]['solver']})")
        ax.plot(toks, [r["error_exact_inverse"]["mean"] for r in rows], ":", color=line[0].get_color(), lw=1)
    ax.set_xscale("log")
    ax.set_yscale("log")
    toks = sorted({r["tokens"] for rows in nystrom.values() for r in rows})
    ax.xaxis.set_minor_formatter(plt.NullFormatter())
    ax.set_xticks(toks, [f"{t:,}" for t in toks])
    ax.set_xlabel("stage-1 tokens N (7×7 landmarks)")
    ax.set_ylabel("‖G − Ĝ‖_F / ‖G‖_F (mean ± sd over images)")
    ax.set_title(title + "\n(dotted: exact (W + εI)⁻¹)", fontsize=8)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _g(x, fmt=".3g") -> str:
    return "–" if x is None else format(x, fmt)


def _q(d: dict) -> str:
    return " / ".join(_g(d[f"{100 * q:g}"]) for q in QUANTILES)


def _model_row(f: str, e: dict) -> list:
    if "missing" in e:
        return [f, "–", "–", e["basis"], "–", "–", "–", f"missing: {e['missing']}"]
    where = e["run_dir"] if e.get("run_dir") else "initialisation"
    pct = (lambda x: "–" if x is None else f"{100 * x:.2f}")
    return [f, _g(e["lam"], "g"), e["seed"], e["basis"], f"`{where}`", pct(e.get("val_top1")), pct(e.get("test_top1")),
            "" if not e.get("stand_in") else f"stand-in: {e['stand_in']}"]


def markdown(result: dict) -> str:
    """why.md: the models, the distance and kernel-value tables, the Nyström errors and the ranking."""
    qs = "/".join(f"{100 * q:g}" for q in QUANTILES)
    parts = [f"# Why: distances, kernel values and Nyström error per kernel family (DESIGN §7.8)\n\n{result['what']}\n",
             "## Models\n\n" + markdown_table(["family", "λ", "seed", "basis", "run (final weights)", "val top-1 %",
                                                 "test top-1 %", "note"],
                                                [_model_row(f, e) for f, e in result["models"].items()])]
    rows, krows = [], []
    for f, stages in result["distances"].items():
        for s in stages:
            where = f"{s['stage']} ({s['tokens']}, {'landmarks' if 'landmark' in s['pairs'] else 'keys'})"
            rows.append([f, where, _q(s["l1"]["q"]), f"{s['l1']['q99_over_q50']:.3f}", f"{s['l1']['hill_alpha']:.1f}",
                         _q(s["l2"]["q"]), f"{s['l2']['q99_over_q50']:.3f}", f"{s['l2']['hill_alpha']:.1f}"])
            krows.append([f, where, f"{s['distance']}, λ {s['lam']:g}, s {s['qk_scale']:.3g}", _q(s["r_over_lam"]["q"]),
                          _q(s["kernel"]["q"]), _g(s["kernel"]["tail_retention"]),
                          f"{100 * s['kernel'][f'below_{DEAD:g}']:.2f}"])
    parts.append(f"## Distances the kernel sees\n\nPer stage (tokens; the queries against the pooled landmarks on a "
                 f"Nyström stage, the keys on an exact one), on q scaled by the layer's qk_scale; quantiles "
                 f"{qs} %; tail indices q99/q50 and Hill's α on the top {100 * HILL_FRACTION:g} %.\n\n"
                 + markdown_table(["family", "stage (N, pairs)", f"L1 q{qs}", "L1 q99/q50", "L1 Hill α",
                                   f"L2 q{qs}", "L2 q99/q50", "L2 Hill α"], rows))
    parts.append("## Kernel values\n\nu = r / λ with the family's own r; k = f(u); retention k(r95)/k(r50): the "
                 "weight a pair at the 95th distance percentile keeps relative to the median pair.\n\n"
                 + markdown_table(["family", "stage (N, pairs)", "r, λ, qk_scale", f"u q{qs}", f"k q{qs}",
                                   "k(r95)/k(r50)", f"% k < {DEAD:g}"], krows))
    nrows = []
    for f, rows_ in result["nystrom"].items():
        for r in rows_:
            e, x = r["error"], r["error_exact_inverse"]
            if e is None:
                nrows.append([f, r["tokens"], "exact stage", "–", "–"])
                continue
            nrows.append([f, r["tokens"], f"{e['mean']:.4f} ± {_g(e['std'], '.4f')} [{e['min']:.4f}, {e['max']:.4f}]",
                          f"{x['mean']:.4f} ± {_g(x['std'], '.4f')}", e["n"]])
    ny = next((r for rows_ in result["nystrom"].values() for r in rows_ if r["error"] is not None), None)
    solver = "" if ny is None else f"{ny['solver']} ({ny['iters']} iterations), ε = {ny['eps']:g}"
    parts.append(f"## Nyström error on stage 1\n\n‖G − Ĝ‖_F / ‖G‖_F, Ĝ = C_q (W + εI)⁻¹ C_kᵀ with 7×7 pooled "
                 f"landmarks; the layers' solver: {solver}; mean ± sd [min, max] over images × heads × stage-1 "
                 f"layers ({result['images']['nystrom']} test images, resized to {', '.join(str(s) for s in result['sizes'])} px).\n\n"
                 + markdown_table(["family", "tokens N", "error, layer's solver", "error, exact (W + εI)⁻¹", "n"], nrows))
    rk = result["ranking"]
    lines = [f"- premise, stage 1 (L1 against L2: q99/q50; Hill α): " + "; ".join(
        f"{f} {p['l1_q99_over_q50']:.3f} vs {p['l2_q99_over_q50']:.3f}, α {p['l1_hill_alpha']:.1f} vs {p['l2_hill_alpha']:.1f}"
        for f, p in rk["premise"].items())]
    lines += [f"- prediction ({rk['prediction']['rule']}): {' > '.join(rk['prediction']['order']) or '–'} "
             f"({', '.join(f'{f} {_g(v)}' for f, v in rk['prediction']['tail_retention'].items())})"]
    for part in ("validation", "test"):
        r = rk[part]
        if r["status"] != "complete":
            lines.append(f"- {part}: {r['status']}")
            continue
        means = ", ".join(f"{f} {100 * r['mean_top1'][f]:.2f}" for f in r["order"])
        lines.append(f"- {part}: {' > '.join(r['order'])} ({means}); Spearman ρ with the prediction "
                     f"{_g(r['spearman_with_prediction'], '.2f')}")
        if part == "test" and r.get("gaussian_minus_laplacian_default"):
            p = r["gaussian_minus_laplacian_default"]
            lines.append(f"  - Gaussian (selected λ) − Laplacian default: {100 * p['mean']:+.2f} points, 95 % CI "
                         f"[{100 * p['ci95'][0]:+.2f}, {100 * p['ci95'][1]:+.2f}] (n = {p['n']}, {p['verdict']})"
                         if p["mean"] is not None and p["ci95"] else f"  - Gaussian − Laplacian default: n = {p['n']}")
    parts.append("## Ranking against the heavy-tail argument\n\n" + "\n".join(lines))
    return "\n\n".join(parts) + "\n"


def run(out: Path, *, study: Study, protocol: dict, families: Sequence[str] = SHIPPED, init: bool = False,
        lams: Mapping[str, float] | None = None,
        study_out: Path = Path(STUDY_OUT), runs: Path = Path(KERNEL_RUNS), accuracy_runs: Path = Path(ACCURACY_RUNS),
        images: int = DIST_IMAGES, nystrom_images: int = NYSTROM_IMAGES, sizes: Sequence[int] = SIZES,
        progress: bool = True) -> dict:
    """The whole analysis; writes OUT/why.json, why.md, <family>.png, nystrom.png and returns why.json's dict."""
    record = read_json(Path(study_out) / "cells.json")
    head_dim = study.head_dim(protocol)
    sel = study.selection(record, head_dim) if record else None
    conf = study.confirmation(record, sel) if record and sel else None
    lams = dict(lams or {})
    if init:
        models = {}
        for f in families:
            lam = float(lams.get(f, study.matched[f]))
            models[f] = {"family": f, "basis": f"{'given' if f in lams else 'matched'} λ, initialisation (no trained weights)",
                         "lam": lam, "seed": SEED, "label": study.label(f, lam), "stand_in": None, "run_dir": None}
    else:
        models = choose_models(record, sel, families, study, runs, accuracy_runs, lams=lams)
    rec = protocol["recipe"]
    n = max(images, nystrom_images)
    loaded = {s: protocol_images(rec["data"], s, n) for s in dict.fromkeys([rec["img_size"], *sizes])}
    base = loaded[rec["img_size"]][:images]
    ny_images = {s: loaded[s][:nystrom_images] for s in sizes}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    distances, nystrom = {}, {}
    what = (f"{'At initialisation' if init else 'Trained models'} of the kernel study ({protocol['name']}: "
            f"{rec['model']}, {rec['img_size']} px {rec['data']}); distances on {images} and the Nyström error on "
            f"{nystrom_images} of a seeded subset (seed {SEED}) of {n} test images, the same images at every size.")
    for family, entry in models.items():
        if "missing" in entry:
            if progress:
                print(f"why: {family}: {entry['missing']}", flush=True)
            continue
        model = (init_model(protocol, family, entry["lam"], study, int(base.shape[1])) if init else load_model(entry))
        stages = stage_distances(capture_qk(model, base))
        summaries = [distance_summary(s) for s in stages]
        distances[family] = summaries
        nystrom[family] = nystrom_errors(model, ny_images)
        src = "initialisation (seed 0)" if init else entry["run_dir"]
        _plot_family(out / f"{family}.png", family, stages, summaries,
                     f"{family}, λ = {entry['lam']:g}: {src}; {images} test images")
        if progress:
            e = nystrom[family]
            print(f"why: {family} λ {entry['lam']:g} ({src}): stage-1 L1 q99/q50 {summaries[0]['l1']['q99_over_q50']:.3f}, "
                  f"median k {summaries[0]['kernel']['q']['50']:.3g}; Nyström error "
                  + ", ".join(f"{r['tokens']}: {_g(r['error'] and r['error']['mean'], '.4f')}" for r in e), flush=True)
    if nystrom:
        _plot_nystrom(out / "nystrom.png", nystrom, f"Nyström error on stage 1 ({'init' if init else 'trained'})")
    result = {"what": what, "init": init, "protocol": protocol["name"], "models": models,
              "study": {"cells": str(Path(study_out) / "cells.json"), "runs": str(runs), "accuracy_runs": str(accuracy_runs),
                        "selection_complete": bool(sel and sel.get("complete")),
                        "confirmation_complete": bool(conf and conf.get("complete"))},
              "images": {"distances": images, "nystrom": nystrom_images, "subset": n, "subset_seed": SEED}, "sizes": list(sizes),
              "quantiles": list(QUANTILES), "tail": {"ratio": f"q{100 * TAIL_Q:g}/q50", "hill_fraction": HILL_FRACTION},
              "distances": distances, "nystrom": nystrom, "ranking": ranking(sel, conf, distances),
              "environment": environment()}
    result = jsonable(result)
    write_json(out / "why.json", result)
    (out / "why.md").write_text(markdown(result))
    if progress:
        print(f"wrote {out}/why.json, why.md and the PNGs", flush=True)
    return result


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laplacianformer kernels why",
                                description="Why the families rank as they do (docs/DESIGN.md §7.8): query–landmark "
                                            "distances and kernel values per stage, the Nyström error at 196, 1,024 "
                                            "and 4,096 stage-1 tokens, and the study's ranking against the heavy-tail "
                                            "prediction, for one model per family.")
    p.add_argument("--init", action="store_true", help="the models at initialisation (matched λ) instead of the trained cells")
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT}; with --init {DEFAULT_OUT}/{INIT_SUBDIR})")
    p.add_argument("--runs", default=KERNEL_RUNS, help=f"the study's run directories (default {KERNEL_RUNS})")
    p.add_argument("--accuracy-runs", default=ACCURACY_RUNS,
                   help=f"the accuracy study's run directories, for reused cells (default {ACCURACY_RUNS})")
    p.add_argument("--study", default=STUDY_OUT, help=f"the study's results, cells.json (default {STUDY_OUT})")
    p.add_argument("--families", nargs="+", default=list(SHIPPED), choices=list(SHIPPED))
    p.add_argument("--lam", action="append", default=[], metavar="FAMILY=LAM",
                   help="analyse FAMILY's cell at this λ instead of the selected or matched one (repeatable)")
    p.add_argument("--images", type=int, default=DIST_IMAGES, help=f"test images for the distances (default {DIST_IMAGES})")
    p.add_argument("--nystrom-images", type=int, default=NYSTROM_IMAGES,
                   help=f"test images per size for the Nyström error (default {NYSTROM_IMAGES})")
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES), help=f"image sides (default {list(SIZES)})")
    p.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the study's cells share the CPUs)")
    return p


def main(argv=None, *, study: Study) -> int:
    args = build_parser().parse_args(sys.argv[1:] if argv is None else argv)

    def body() -> int:
        from .ablate import build_protocol
        from .accuracy import PROTOCOL_NAME, VAL_PROTOCOL

        for name in ("images", "nystrom_images", "threads"):
            if getattr(args, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(args, name)}")
        torch.set_num_threads(args.threads)
        lams = {}
        for item in args.lam:
            family, _, value = item.partition("=")
            try:
                lam = float(value)
            except ValueError:
                lam = -1.0
            if family not in SHIPPED or not lam > 0:
                raise ValueError(f"lam: expected FAMILY=LAM with FAMILY one of {list(SHIPPED)} and LAM > 0, got {item!r}")
            lams[family] = lam
        out = Path(args.out or (f"{DEFAULT_OUT}/{INIT_SUBDIR}" if args.init else DEFAULT_OUT))
        run(out, study=study, protocol=build_protocol(PROTOCOL_NAME, VAL_PROTOCOL), families=args.families,
            init=args.init, lams=lams, study_out=Path(args.study), runs=Path(args.runs), accuracy_runs=Path(args.accuracy_runs),
            images=args.images, nystrom_images=args.nystrom_images, sizes=args.sizes)
        return 0

    return run_command("kernels why", body)
