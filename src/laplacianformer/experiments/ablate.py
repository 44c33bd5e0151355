"""``laplacianformer ablate NAME``: train the micro model once per (value, seed) and tabulate top-1.

Every cell is one call of ``laplacianformer.train.train`` with the shared budget below and one setting
changed (``ablations.ABLATIONS``).  Results go to ``OUT/NAME.json`` after each cell; a rerun with the same
settings skips the cells already recorded (resume), a rerun with different settings refuses unless
``--fresh``.  At the end it prints a Markdown table (mean ± std over seeds), writes ``OUT/NAME.md`` and a
bar chart ``OUT/NAME.png``.

``--quick`` is the smoke test: a few optimiser steps on 256 images, one seed, two values; its numbers
are NOT results (the JSON says ``"smoke_test": true``).
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

from .ablations import ABLATIONS, Ablation, get_ablation, resolve_variant
from .common import environment, markdown_table, mean_std, read_json, write_json

BASE = {
    "model": "laplacianformer_micro",
    "data": "fashion-mnist",
    "img_size": 28,
    "model_kwargs": {"stem_stride": 2},
    "train_subset": 2000,
    "test_subset": 1000,
    "epochs": 2,
    "batch_size": 64,
    "lr": 2e-3,
    "warmup_epochs": 0.25,
    "drop_path": 0.0,
    "threads": 1,
}
QUICK = {**BASE, "train_subset": 128, "test_subset": 64, "epochs": 1, "max_steps": 3, "batch_size": 16}
FULL_SEEDS = {"lambda": 3, "solver": 3}
DEFAULT_OUT = "results/ablations"
QUICK_OUT = "runs/ablations-quick"
DEFAULT_RUNS = "runs/ablations"
_KEEP = ("top1", "top5", "loss", "images_per_s", "params", "wall_time_s", "train_time_s", "steps",
         "epochs_completed", "history", "peak_memory_mb", "run_dir")


def _train_api():
    try:
        from ..train import TrainConfig, train
    except ImportError as exc:
        raise RuntimeError(f"ablate: laplacianformer.train is not available ({exc})") from exc
    return TrainConfig, train


def head_dim_of(base: dict) -> int | None:
    """The attention head dim of the base model, or None when its stages use different head dims."""
    from ..layers import LaplacianAttention
    from ..models import create_model

    model = create_model(base["model"], num_classes=10, in_chans=1, **base.get("model_kwargs", {}))
    dims = {m.head_dim for m in model.modules() if isinstance(m, LaplacianAttention)}
    return dims.pop() if len(dims) == 1 else None


def cell_key(label: str, seed: int) -> str:
    return f"{label}|seed={seed}"


def canonical_attention(attn: str, attn_kwargs: dict, head_dim: int | None) -> dict:
    """The attention settings with every default filled in (qk_scale None -> d**-0.5 when d is known),
    so that two variants that build the same model compare equal."""
    import inspect

    from ..layers import LaplacianAttention
    from ..layers.token_mixer import LAPLACIAN_ATTN_KWARGS

    if attn == "softmax":
        return {"attn": attn, **attn_kwargs}
    params = inspect.signature(LaplacianAttention.__init__).parameters
    full = {k: params[k].default for k in LAPLACIAN_ATTN_KWARGS if k in params}
    full.update(attn_kwargs)
    if full.get("qk_scale") is None and head_dim is not None:
        full["qk_scale"] = float(head_dim) ** -0.5
    full = {k: list(v) if isinstance(v, tuple) else v for k, v in full.items()}
    return {"attn": attn, **_jsonable(full)}


def find_same_cell(out: Path, settings: dict, config: dict, seed: int, head_dim: int | None) -> tuple[str, dict] | None:
    """A cell recorded in any OUT/*.json (same budget settings) whose model is identical to ``config``:
    the ablations share their default value, so its run is trained once.  Returns (where, cell) or None."""
    for path in sorted(out.glob("*.json")):
        rec = read_json(path)
        if not isinstance(rec, dict) or rec.get("settings") != settings:
            continue
        for key, cell in rec.get("cells", {}).items():
            if cell.get("seed") == seed and "reused_from" not in cell and \
                    canonical_attention(cell["attn"], cell["attn_kwargs"], head_dim) == config:
                return f"{rec['ablation']}/{key}", cell
    return None


def _jsonable(value):
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if hasattr(value, "item"):
        return _jsonable(value.item())
    return str(value)


def run_ablation(
    ablation: Ablation,
    *,
    base: dict,
    seeds: list[int],
    labels: list[str],
    out: Path,
    smoke_test: bool,
    runs: Path | None = None,
    fresh: bool = False,
    progress: bool = True,
    train_fn=None,
) -> dict:
    """Runs the missing (value, seed) cells of ``ablation`` and returns the record saved in OUT/NAME.json.

    Each cell's training run directory (checkpoint, curves) is RUNS/NAME/LABEL-sSEED (default OUT/runs).
    ``train_fn``, when given, replaces ``train(TrainConfig(**cell))`` and receives the cell's config dict."""
    from tqdm.auto import tqdm

    TrainConfig, train = _train_api() if train_fn is None else (None, train_fn)
    path = out / f"{ablation.name}.json"
    settings = {"base": base, "smoke_test": smoke_test}
    record = None if fresh else read_json(path)
    if record is not None and record.get("settings") != _jsonable(settings):
        raise ValueError(
            f"out: {path} was recorded with other settings ({record.get('settings')}); "
            "pass --fresh to overwrite it or choose another --out"
        )
    if record is None:
        record = {"ablation": ablation.name, "setting": ablation.setting, "question": ablation.question,
                  "default": ablation.default, "settings": _jsonable(settings), "environment": environment(),
                  "cells": {}}
    head_dim = head_dim_of(base) if train_fn is None else None
    todo = [(lb, s) for lb in labels for s in seeds if cell_key(lb, s) not in record["cells"]]
    bar = tqdm(todo, desc=f"ablate {ablation.name}", disable=not progress)
    for label, seed in bar:
        bar.set_postfix_str(f"{label} seed {seed}")
        fields = resolve_variant(ablation.variant(label), head_dim)
        canonical = canonical_attention(fields["attn"], fields["attn_kwargs"], head_dim)
        same = find_same_cell(out, record["settings"], canonical, seed, head_dim)
        if same is not None:
            record["cells"][cell_key(label, seed)] = {**same[1], "label": label, "attn_kwargs": _jsonable(fields["attn_kwargs"]),
                                                      "reused_from": same[0]}
            write_json(path, record)
            continue
        run_dir = Path(runs or out / "runs") / ablation.name / f"{label}-s{seed}"
        config = {**base, **fields, "model_kwargs": {**base.get("model_kwargs", {}), **fields["model_kwargs"]},
                  "seed": seed, "progress": False, "out": str(run_dir)}
        start = time.perf_counter()
        result = train(TrainConfig(**config)) if TrainConfig is not None else train(config)
        if result.get("interrupted"):
            raise KeyboardInterrupt(f"training of {label} seed {seed} was interrupted ({result['interrupted']}); "
                                    "that cell is not recorded, rerun the same command to resume")
        cell = {k: _jsonable(result[k]) for k in _KEEP if k in result}
        cell["top1"] = _jsonable(result["top1"])
        cell.update({"label": label, "seed": seed, "attn": fields["attn"], "attn_kwargs": _jsonable(fields["attn_kwargs"]),
                     "seconds": round(time.perf_counter() - start, 2)})
        record["cells"][cell_key(label, seed)] = cell
        write_json(path, record)
    write_json(path, record)
    return record


def summarise(record: dict, labels: list[str] | None = None) -> list[dict]:
    """Per value: top-1 and test loss mean ± std over the recorded seeds, in registry order, and the paired
    difference to the default value (same seeds: same data subsets and initialisation)."""
    by_label: dict[str, list[dict]] = {}
    for cell in record["cells"].values():
        by_label.setdefault(cell["label"], []).append(cell)
    order = labels or [v.label for v in ABLATIONS[record["ablation"]].variants]
    rows = []
    for label in order:
        cells = sorted(by_label.get(label, []), key=lambda c: c["seed"])
        if not cells:
            continue
        top1 = mean_std([c["top1"] for c in cells])
        loss = mean_std([c["loss"] for c in cells if isinstance(c.get("loss"), (int, float))])
        secs = mean_std([c["seconds"] for c in cells])
        ref = {c["seed"]: c["top1"] for c in by_label.get(record.get("default"), [])}
        diffs = [c["top1"] - ref[c["seed"]] for c in cells if c["seed"] in ref]
        delta = mean_std(diffs) if diffs and label != record.get("default") else (math.nan, math.nan)
        rows.append({"label": label, "seeds": [c["seed"] for c in cells], "top1": [c["top1"] for c in cells],
                     "delta_mean": delta[0], "delta_std": delta[1], "delta_n": len(diffs),
                     "top1_mean": top1[0], "top1_std": top1[1], "loss_mean": loss[0], "loss_std": loss[1],
                     "seconds_mean": secs[0]})
    return rows


def _pct(x: float) -> float:
    return 100.0 * x if x <= 1.0 else x


def ablation_table(record: dict, rows: list[dict]) -> str:
    """Markdown table of ``summarise`` rows (± only where there are several seeds); the default of docs/DESIGN.md is marked."""
    out = []
    for r in rows:
        name = r["label"] + (" (default)" if r["label"] == record.get("default") else "")
        many = len(r["seeds"]) > 1
        top1 = f"{_pct(r['top1_mean']):.2f}" + (f" ± {_pct(r['top1_std']):.2f}" if many else "")
        loss = f"{r['loss_mean']:.3f}" + (f" ± {r['loss_std']:.3f}" if many else "")
        if math.isnan(r["delta_mean"]):
            delta = "—"
        else:
            delta = f"{100 * r['delta_mean']:+.2f}" + (f" ± {100 * r['delta_std']:.2f}" if r["delta_n"] > 1 else "")
        out.append([name, top1, delta, len(r["seeds"]), loss, f"{r['seconds_mean']:.0f}"])
    header = [record["setting"], "top-1 % (mean ± std)", "paired Δ vs default (points)", "seeds", "test loss", "s / run"]
    return markdown_table(header, out)


def plot_ablation(record: dict, rows: list[dict], path: Path) -> None:
    """Bar chart of mean top-1 with std error bars and the individual seeds as dots."""
    from .common import pyplot

    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.4 * len(rows) + 2.5, 3.8))
    xs = range(len(rows))
    means = [_pct(r["top1_mean"]) for r in rows]
    stds = [_pct(r["top1_std"]) for r in rows]
    colors = ["tab:orange" if r["label"] == record.get("default") else "tab:blue" for r in rows]
    ax.bar(xs, means, yerr=stds, color=colors, alpha=0.8, capsize=4)
    for x, r in zip(xs, rows):
        ax.plot([x] * len(r["top1"]), [_pct(t) for t in r["top1"]], "k.", ms=5)
    lo = min(min(_pct(t) for t in r["top1"]) for r in rows)
    hi = max(max(_pct(t) for t in r["top1"]) for r in rows)
    ax.set_ylim(max(0.0, lo - 3.0), min(100.0, hi + 2.0))
    ax.set_xticks(list(xs), [r["label"] for r in rows])
    ax.set_ylabel("test top-1 (%)")
    base = record["settings"]["base"]
    tag = "SMOKE TEST, not a result" if record["settings"]["smoke_test"] else f"{base.get('epochs')} ep on {base.get('train_subset')} imgs"
    ax.set_title(f"ablation {record['ablation']} ({tag}); orange = default, dots = seeds, y axis truncated", fontsize=9)
    ax.grid(True, axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="laplacianformer ablate",
        description="Run the ablations of DESIGN.md §7 on the micro model (Fashion-MNIST subset); resumable.",
    )
    p.add_argument("names", nargs="*", help=f"ablations to run: {', '.join(ABLATIONS)} or 'all'")
    p.add_argument("--list", action="store_true", help="list the ablations and their values, then exit")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny budget, 1 seed, 2 values (not a result)")
    p.add_argument("--seeds", type=int, default=None,
                   help="number of seeds 0..N-1 (default: 3 for lambda and solver, 1 otherwise; 1 with --quick)")
    p.add_argument("--values", nargs="+", default=None, help="run only these values (labels as in --list)")
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT}; {QUICK_OUT} with --quick)")
    p.add_argument("--runs", default=None,
                   help=f"root of the per-cell training run directories (default {DEFAULT_RUNS}; OUT/runs with --quick)")
    p.add_argument("--report", action="store_true", help="train nothing: redo the table and plot from the recorded JSON")
    p.add_argument("--fresh", action="store_true", help="discard recorded cells instead of resuming")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    for flag, typ in (("epochs", int), ("train-subset", int), ("test-subset", int), ("max-steps", int),
                      ("img-size", int), ("batch-size", int), ("lr", float), ("threads", int)):
        p.add_argument(f"--{flag}", type=typ, default=None, help=f"override the budget's {flag.replace('-', '_')}")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for a in ABLATIONS.values():
            print(f"{a.name:10s} {a.setting:10s} {', '.join(a.labels):45s} {a.question}")
        return 0
    if not args.names:
        print("ablate: name: expected one or more of " + ", ".join(ABLATIONS) + " or 'all' (see --list)", file=sys.stderr)
        return 2
    names = list(ABLATIONS) if "all" in args.names else args.names
    try:
        ablations = [get_ablation(n) for n in names]
    except ValueError as exc:
        print(f"ablate: {exc}", file=sys.stderr)
        return 2
    base = dict(QUICK if args.quick else BASE)
    for key in ("epochs", "train_subset", "test_subset", "max_steps", "img_size", "batch_size", "lr", "threads"):
        if getattr(args, key) is not None:
            base[key] = getattr(args, key)
    out = Path(args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    for ablation in ablations:
        n_seeds = args.seeds or (1 if args.quick else FULL_SEEDS.get(ablation.name, 1))
        try:
            labels = args.values or (list(ablation.quick) if args.quick else ablation.labels)
            for lb in labels:
                ablation.variant(lb)
            if args.report:
                record = read_json(out / f"{ablation.name}.json")
                if record is None:
                    raise ValueError(f"out: {out / (ablation.name + '.json')} does not exist (nothing recorded yet)")
                labels = args.values or [lb for lb in ablation.labels if any(c["label"] == lb for c in record["cells"].values())]
            else:
                record = run_ablation(ablation, base=base, seeds=list(range(n_seeds)), labels=labels, out=out,
                                      smoke_test=args.quick, fresh=args.fresh,
                                      runs=Path(args.runs or (out / "runs" if args.quick else DEFAULT_RUNS)),
                                      progress=not args.no_progress)
        except ValueError as exc:
            print(f"ablate: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt as exc:
            print(f"ablate: {exc}", file=sys.stderr)
            return 130
        rows = summarise(record, labels)
        table = ablation_table(record, rows)
        smoke = record["settings"]["smoke_test"]
        title = f"### ablation `{ablation.name}`" + (" (SMOKE TEST, not a result)" if smoke else "")
        (out / f"{ablation.name}.md").write_text(f"{title}\n\n{ablation.question}\n\n{table}\n")
        plot_ablation(record, rows, out / f"{ablation.name}.png")
        print(f"\n{title}\n\n{table}\n\nwrote {out / (ablation.name + '.json')}, .md, .png")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
