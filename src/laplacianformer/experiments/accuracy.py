"""``laplacianformer accuracy``: the configuration that closes the gap to softmax, chosen on a held-out
validation split and confirmed on the test set (docs/DESIGN.md §7.5).

Protocol ``fmnist28-val``: the ablations' recipe (``protocol.PROTOCOL``) with ``holdout`` = 10,000 of the
60,000 training images held out as the validation split (``data.holdout_indices``, seeded by
``holdout_seed`` alone: the same split for every cell, recorded in every results file with a hash of its
indices); each cell trains on the other 50,000. A cell records its final validation top-1, which is all the
selection reads, and the test top-1 of the same final weights (``cell.py``'s ``final_test``), which only
the confirmation reads: cells need not be retrained for the confirmation, and a test holds the selection
unchanged when the test numbers change.

Stages (each resumable per (configuration, seed) cell; a cell killed part-way resumes from its last
checkpoint, ``save_every_steps``):

    select   every candidate (``CANDIDATES`` and the ``--combine a+b[+c]`` combinations), seeds 0..S-1
             -> OUT/selection.json (validation top-1 per seed, mean, n; ranking; the choice)
    confirm  the choice (best mean validation top-1 among candidates with >= 3 seeds, or ``--choose``), the
             best output scale alone (``best_scale``: the evidence of the default scale, §7.6), the paper
             default, the Gaussian at SOFT's bandwidth and SR-softmax, seeds 0..4
             -> OUT/confirmation.json (test top-1 per seed; per pair mean Δ, paired 95 % CI, verdict)
    report   rewrite both files (and their Markdown) from OUT/cells.json
    variants the detection runs the complete selection asks for (the choice and the best scale fix alone):
             one "LABEL BACKBONE_KWARGS_JSON" line each, read by scripts/detection_runs.sh

In the background:

    nohup laplacianformer accuracy select --jobs 2 > accuracy-select.log 2>&1 &
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path

from .ablate import CellRunner, _fmt_time, build_protocol, cell_key
from .common import environment, jsonable as _jsonable, markdown_table, pyplot, read_json, run_command, write_json
from .protocol import PROTOCOL, QUICK, same_protocol
from .stats import describe, on_common_seeds, paired, verdict

PROTOCOL_NAME = "fmnist28-val"
VAL_PROTOCOL = {**PROTOCOL, "holdout": 10_000, "holdout_seed": 0, "save_every_steps": 200}
QUICK_NAME = "quick-smoke-val"
QUICK_VAL = {**QUICK, "holdout": 256, "holdout_seed": 0}
DEFAULT_OUT = "results/accuracy"
QUICK_OUT = "runs/accuracy-quick"
DEFAULT_RUNS = "runs/accuracy"
SELECT_SEEDS = 3
CONFIRM_SEEDS = 5
MIN_SELECT_SEEDS = 3

DEFAULT = "default"
UNSCALED = "(paper default, unscaled: norm_scale='one')"
"""How the tables name an empty ``attn_kwargs``: cells train under version 1's defaults
(``protocol.CELL_SETTINGS_VERSION``), whatever the library's default output scale is now (DESIGN §7.6)."""
# label -> (attn, attn_kwargs): the candidates of the selection (one setting changed from the paper default)
CANDIDATES: dict[str, tuple[str, dict]] = {
    DEFAULT: ("laplacian", {}),
    "scale_inv_sqrt_n": ("laplacian", {"norm_scale": "inv_sqrt_n"}),
    "scale_inv_n": ("laplacian", {"norm_scale": "inv_n"}),
    "scale_learned": ("laplacian", {"norm_scale": "learned"}),
    "inline": ("laplacian", {"norm": "inline"}),
    "rowsum": ("laplacian", {"norm": "rowsum"}),
    "lam_0.5": ("laplacian", {"lam": 0.5}),
    "lam_1": ("laplacian", {"lam": 1.0}),
    "tied_keys": ("laplacian", {"tie_qk": True}),
    "qk_scale_1": ("laplacian", {"qk_scale": 1.0}),
}
# the comparisons of the confirmation that are not candidates
BASELINES: dict[str, tuple[str, dict]] = {
    "gaussian_soft": ("gaussian", {}),
    "sr_softmax": ("softmax", {}),
}
CHOICE_RULE = (f"highest mean validation top-1 on the seeds every candidate has (>= {MIN_SELECT_SEEDS}) "
               "(ties: the earlier candidate in the table)")


def combination(label: str) -> tuple[str, dict]:
    """The configuration of a candidate label or a combination ``a+b[+c]`` of candidates (their settings
    merged; ValueError naming the label when two set one key differently or a part is unknown)."""
    if label in CANDIDATES:
        return CANDIDATES[label]
    if label in BASELINES:
        return BASELINES[label]
    parts = label.split("+")
    unknown = [p for p in parts if p not in CANDIDATES or p == DEFAULT]
    if len(parts) < 2 or unknown:
        raise ValueError(f"candidate: {label!r}: expected one of {list(CANDIDATES) + list(BASELINES)} or a "
                         f"combination 'a+b[+c]' of non-default candidates (unknown: {unknown or [label]})")
    kwargs: dict = {}
    for p in parts:
        attn, kw = CANDIDATES[p]
        for k, v in kw.items():
            if k in kwargs and kwargs[k] != v:
                raise ValueError(f"candidate: {label!r}: {p} sets {k}={v!r}, another part {kwargs[k]!r}")
            kwargs[k] = v
    return "laplacian", kwargs


def validation_split(rec: dict) -> dict:
    """The record of the held-out split: size, seed, source and a SHA-256 of its sorted indices."""
    from ..data import holdout_indices
    from ..data.fashion_mnist import load_fashion_mnist

    n = len(load_fashion_mnist("train")[1]) if rec["data"] == "fashion-mnist" else None
    idx = holdout_indices(n, rec["holdout"], rec["holdout_seed"])
    return {"data": rec["data"], "from": "train", "train_items": n, "holdout": rec["holdout"],
            "holdout_seed": rec["holdout_seed"], "trained_on": n - rec["holdout"],
            "indices_sha256": hashlib.sha256(idx.astype("<i8").tobytes()).hexdigest(),
            "first_indices": [int(i) for i in idx[:8]]}


def open_cells(path: Path, protocol: dict, split: dict | None) -> dict:
    """The cells record at ``path`` (a new one when absent); refuses a file recorded under another protocol."""
    record = read_json(path)
    if record is not None and not same_protocol(record.get("protocol"), protocol):
        raise ValueError(f"out: {path} was recorded under another protocol; choose another --out")
    if record is None:
        record = {"protocol": protocol, "validation_split": split, "environment": environment(), "cells": {}}
    return record


def run_cells(labels: list[str], seeds: list[int], *, protocol: dict, out: Path, runs: Path, jobs: int = 1,
              final_test: bool = True, progress: bool = True, train_fn=None, split: dict | None = None) -> dict:
    """Trains the missing (label, seed) cells, seed-major, and returns OUT/cells.json's record (written after
    every cell). ``train_fn(config) -> result`` replaces the training (tests)."""
    path = out / "cells.json"
    record = open_cells(path, protocol, split)
    todo = []
    for seed in seeds:
        for lb in labels:
            if cell_key(lb, seed) in record["cells"]:
                continue
            attn, kwargs = combination(lb)
            config = {**protocol["recipe"], "attn": attn, "attn_kwargs": kwargs, "seed": seed, "progress": False,
                      "out": str(runs / f"{lb}-s{seed}"), "resume": True, "final_test": final_test}
            todo.append((cell_key(lb, seed), config))
    return record_cells(todo, record, path, combination, jobs=jobs, train_fn=train_fn, progress=progress,
                        name="accuracy")


def record_cells(todo: list[tuple[str, dict]], record: dict, path: Path, configure, *, jobs: int = 1, train_fn=None,
                 progress: bool = True, name: str = "accuracy") -> dict:
    """Trains the ``todo`` cells ((``LABEL|seed=S``, training config)) and writes each into ``record`` and
    ``path`` as it finishes: validation and test top-1, time, steps; ``configure(label) -> (attn, kwargs)``.
    A cell interrupted by a signal raises KeyboardInterrupt (its checkpoint resumes it)."""
    write_json(path, record)
    times = []
    for i, (key, result, secs) in enumerate(CellRunner(jobs, train_fn).run(todo), 1):
        lb, seed = key.split("|seed=")[0], int(key.split("|seed=")[1])
        if result.get("interrupted"):
            raise KeyboardInterrupt(f"{lb} seed {seed} was interrupted ({result['interrupted']}); rerun to resume")
        attn, kwargs = configure(lb)
        record["cells"][key] = {
            "label": lb, "seed": seed, "attn": attn, "attn_kwargs": _jsonable(kwargs),
            "val_top1": _jsonable(result["top1"]), "eval_split": result.get("eval_split"),
            "test_top1": _jsonable(result.get("final_test_top1")), "seconds": round(secs, 1),
            **{k: _jsonable(result[k]) for k in ("steps", "params", "train_time_s", "history", "resumed") if k in result}}
        write_json(path, record)
        times.append(secs)
        if progress:
            left = len(todo) - i
            eta = left * sum(times) / len(times) / min(jobs, max(left, 1))
            print(f"[{name} {i}/{len(todo)}] {lb} seed {seed}: val top-1 {100 * float(result['top1']):.2f} % in "
                  f"{_fmt_time(secs)}; {left} left, ETA {_fmt_time(eta)}", flush=True)
    return record


def _per_seed(record: dict, label: str, field: str) -> dict[int, float]:
    return {c["seed"]: float(c[field]) for c in record["cells"].values()
            if c["label"] == label and c.get(field) is not None}


def selection(record: dict) -> dict:
    """selection.json from the cells: validation top-1 only (``val_top1``; never ``test_top1``), on the seeds
    every candidate has (``stats.on_common_seeds``: the confirmation's extra seeds never move the choice)."""
    labels = []
    for c in record["cells"].values():
        if c["label"] not in BASELINES and c["label"] not in labels:
            labels.append(c["label"])
    order = {lb: i for i, lb in enumerate(CANDIDATES)}
    labels.sort(key=lambda lb: (order.get(lb, len(order)), lb))
    per_label = on_common_seeds({lb: _per_seed(record, lb, "val_top1") for lb in labels})
    candidates, base = {}, per_label.get(DEFAULT, {})
    for lb in labels:
        attn, kwargs = combination(lb)
        vals = per_label[lb]
        d = describe(list(vals.values()))
        entry = {"attn": attn, "attn_kwargs": _jsonable(kwargs), "val_top1": {str(s): v for s, v in sorted(vals.items())},
                 "n": d.n, "mean": d.mean, "std": d.std}
        if lb != DEFAULT:
            ci = paired(vals, base)
            entry["vs_default"] = {"n": ci.n, "mean": ci.mean, "ci95": ci.ci}
        candidates[lb] = entry
    eligible = [lb for lb in labels if candidates[lb]["n"] >= MIN_SELECT_SEEDS]
    ranking = sorted(eligible, key=lambda lb: (-candidates[lb]["mean"], labels.index(lb)))
    return {"protocol": record["protocol"], "validation_split": record.get("validation_split"),
            "choice_rule": CHOICE_RULE, "candidates": candidates, "ranking": ranking,
            "chosen": ranking[0] if ranking else None,
            "complete": bool(labels) and all(candidates[lb]["n"] >= MIN_SELECT_SEEDS for lb in labels)}


SCALE_PREFIX = "scale_"


def detection_variants(sel: dict) -> dict[str, dict]:
    """The detection runs of the accuracy issue from a complete selection: {label: backbone_kwargs} for the
    chosen configuration and the best output-scale fix alone (highest mean validation top-1 among the
    ``scale_*`` candidates with >= MIN_SELECT_SEEDS seeds), so the detection gap can be attributed. Empty
    while the selection is incomplete."""
    if not sel.get("complete") or sel.get("chosen") is None:
        return {}
    cands = sel["candidates"]
    labels = dict.fromkeys([sel["chosen"], *filter(None, [best_scale(sel)])])
    return {lb: {"attn": cands[lb]["attn"], "attn_kwargs": cands[lb]["attn_kwargs"]} for lb in labels}


def best_scale(sel: dict) -> str | None:
    """The best output-scale fix alone (the first ``scale_*`` candidate of the ranking), or None: the
    candidate that decides the default output scale (docs/DESIGN.md §4.6, §7.6)."""
    scales = [lb for lb in sel.get("ranking", []) if lb in CANDIDATES and lb.startswith(SCALE_PREFIX)]
    return scales[0] if scales else None


CLAIMS = (  # (a, b, side): the claim "a beats b" (+1) checked on the test set
    ("{chosen}", DEFAULT, 1), ("{chosen}", "gaussian_soft", 1), ("{chosen}", "sr_softmax", 1),
    (DEFAULT, "gaussian_soft", 1), (DEFAULT, "sr_softmax", 1),
)
SCALE_CLAIMS = (("{scale}", DEFAULT, 1), ("{scale}", "sr_softmax", 1))
"""The claims of the best output scale alone (``best_scale``), when its cells have test scores: the evidence
of the default output scale (docs/DESIGN.md §7.6)."""


def confirmation(record: dict, chosen: str, scale: str | None = None) -> dict:
    """confirmation.json from the cells: test top-1 per seed of the chosen configuration, the best output scale
    alone (``scale``, when it has test scores), the paper default and the baselines; per claim the paired
    mean Δ (a − b), its 95 % CI and the verdict (``stats.verdict``)."""
    if scale is not None and not _per_seed(record, scale, "test_top1"):
        scale = None
    configs = {}
    for lb in dict.fromkeys((chosen, *filter(None, [scale]), DEFAULT, *BASELINES)):
        attn, kwargs = combination(lb)
        vals = _per_seed(record, lb, "test_top1")
        d = describe(list(vals.values()))
        configs[lb] = {"attn": attn, "attn_kwargs": _jsonable(kwargs),
                       "test_top1": {str(s): v for s, v in sorted(vals.items())}, "n": d.n, "mean": d.mean, "std": d.std}
    pairs = []
    for a, b, side in CLAIMS + (SCALE_CLAIMS if scale is not None and scale != chosen else ()):
        a = a.format(chosen=chosen, scale=scale)
        if a == b:
            continue
        ci = paired(_per_seed(record, a, "test_top1"), _per_seed(record, b, "test_top1"))
        pairs.append({"a": a, "b": b, "claim": f"{a} > {b}", "n": ci.n, "mean": ci.mean, "ci95": ci.ci,
                      "halfwidth": ci.halfwidth, "verdict": verdict(ci, side)})
    return {"protocol": record["protocol"], "validation_split": record.get("validation_split"), "chosen": chosen,
            "best_scale": scale, "configurations": configs, "pairs": pairs,
            "complete": all(c["n"] >= CONFIRM_SEEDS for c in configs.values())}


def _pts(x) -> str:
    return "–" if x is None else f"{100 * x:.2f}"


def _ci(ci) -> str:
    return "–" if not ci else f"[{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"


def selection_markdown(sel: dict) -> str:
    rows = []
    for rank, lb in enumerate(sel["ranking"] + [lb for lb in sel["candidates"] if lb not in sel["ranking"]], 1):
        c = sel["candidates"][lb]
        vs = c.get("vs_default") or {}
        rows.append([rank if lb in sel["ranking"] else "–", lb, c["attn_kwargs"] or UNSCALED, c["n"],
                     _pts(c["mean"]), _pts(c["std"]), "–" if lb == DEFAULT else f"{100 * vs['mean']:+.2f}" if vs.get("mean") is not None else "–",
                     _ci(vs.get("ci95"))])
    split = sel.get("validation_split") or {}
    head = (f"Selection on validation data ({sel['protocol']['name']}: {split.get('holdout')} of "
            f"{split.get('train_items')} training images held out, seed {split.get('holdout_seed')}, "
            f"sha256 {str(split.get('indices_sha256'))[:12]}…). Rule: {sel['choice_rule']}. "
            f"Chosen: **{sel['chosen']}**{'' if sel['complete'] else ' (selection incomplete)'}.")
    return head + "\n\n" + markdown_table(
        ["rank", "candidate", "settings", "seeds", "val top-1 %", "std", "Δ vs default", "paired 95 % CI"], rows)


def claims_markdown(conf: dict) -> str:
    """The confirmation's claims as a table: claim, paired seeds, mean Δ of test top-1, its 95 % CI, verdict."""
    return markdown_table(["claim", "n", "Δ (points)", "paired 95 % CI", "verdict"],
                          [[p["claim"], p["n"], "–" if p["mean"] is None else f"{100 * p['mean']:+.2f}",
                            _ci(p["ci95"]), p["verdict"]] for p in conf["pairs"]])


def confirmation_markdown(conf: dict) -> str:
    rows = [[lb, c["attn"], c["attn_kwargs"] or (UNSCALED if c["attn"] == "laplacian" else "–"), c["n"],
             _pts(c["mean"]), _pts(c["std"])]
            for lb, c in conf["configurations"].items()]
    table = markdown_table(["configuration", "attn", "settings", "seeds", "test top-1 %", "std"], rows)
    return (f"Confirmation on the test set (chosen on validation: **{conf['chosen']}**"
            f"{'' if conf['complete'] else '; incomplete'}).\n\n{table}\n\n{claims_markdown(conf)}")


def _plot(path: Path, rows: list[tuple[str, dict[str, float]]], xlabel: str, title: str, mark: str | None) -> None:
    """Per configuration: its per-seed values (dots) and their mean (bar), in points; ``mark`` drawn bold."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(7, 0.9 + 0.38 * len(rows)))
    for i, (label, per_seed) in enumerate(rows):
        vals = [100 * v for v in per_seed.values()]
        if not vals:
            continue
        mean = sum(vals) / len(vals)
        ax.barh(i, mean, color="tab:orange" if label == mark else "tab:blue", alpha=0.45)
        ax.plot(vals, [i] * len(vals), "k.", ms=4)
        ax.text(mean, i, f" {mean:.2f}", va="center", fontsize=7)
    ax.set_yticks(range(len(rows)))
    ax.set_yticklabels([lb for lb, _ in rows], fontsize=7)
    lo = min((100 * v for _, d in rows for v in d.values()), default=0.0)
    hi = max((100 * v for _, d in rows for v in d.values()), default=100.0)
    ax.set_xlim(lo - 1.0, hi + 1.0)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(out: Path, chosen: str | None = None) -> dict:
    """selection.json/.md and (when a choice exists) confirmation.json/.md from OUT/cells.json."""
    record = read_json(out / "cells.json")
    if record is None:
        raise ValueError(f"out: {out / 'cells.json'} does not exist (no cells recorded yet)")
    sel = selection(record)
    write_json(out / "selection.json", sel)
    (out / "selection.md").write_text(selection_markdown(sel) + "\n")
    order = sel["ranking"] + [lb for lb in sel["candidates"] if lb not in sel["ranking"]]
    _plot(out / "selection.png", [(lb, sel["candidates"][lb]["val_top1"]) for lb in order], "validation top-1 (%)",
          f"selection on validation data ({sel['protocol']['name']}); dots: seeds", sel["chosen"])
    done = {"selection": sel}
    chosen = chosen or sel["chosen"]
    if chosen is not None and any(c["label"] in BASELINES for c in record["cells"].values()):
        conf = confirmation(record, chosen, best_scale(sel))
        write_json(out / "confirmation.json", conf)
        (out / "confirmation.md").write_text(confirmation_markdown(conf) + "\n")
        _plot(out / "confirmation.png", [(lb, c["test_top1"]) for lb, c in conf["configurations"].items()],
              "test top-1 (%)", f"confirmation on the test set (chosen on validation: {chosen})", chosen)
        done["confirmation"] = conf
    return done


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laplacianformer accuracy",
                                description="Select a configuration on validation data, confirm it on test "
                                            "(docs/DESIGN.md §7.5); resumable per cell.")
    p.add_argument("stage", choices=("select", "confirm", "report", "list", "variants"),
                   help="variants: the detection runs the selection asks for, one 'LABEL JSON' line each "
                        "(scripts/detection_runs.sh reads them)")
    p.add_argument("--values", nargs="+", default=None, help="select: only these candidates (default: all)")
    p.add_argument("--combine", nargs="+", default=[], metavar="A+B",
                   help="select: also these combinations of candidates (e.g. lam_0.5+inline+tied_keys)")
    p.add_argument("--choose", default=None, help="confirm: this configuration instead of the selection's choice")
    p.add_argument("--seeds", type=int, default=None, help=f"seeds 0..N-1 (select {SELECT_SEEDS}, confirm {CONFIRM_SEEDS})")
    p.add_argument("--jobs", type=int, default=1, help="cells at once, each a single-threaded process")
    p.add_argument("--out", default=None, help=f"results directory (default {DEFAULT_OUT}; {QUICK_OUT} with --quick)")
    p.add_argument("--runs", default=None, help=f"per-cell run directories (default {DEFAULT_RUNS})")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny budget (its numbers are not results)")
    return p


def _stage(args) -> int:
    """One stage of ``main`` (ValueError / KeyboardInterrupt handled by ``run_command``)."""
    out = Path(args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    runs = Path(args.runs or (out / "runs" if args.quick else DEFAULT_RUNS))
    if args.jobs < 1:
        raise ValueError(f"jobs: expected >= 1, got {args.jobs}")
    if args.stage == "variants":
        for lb, kwargs in detection_variants(read_json(out / "selection.json") or {}).items():
            print(lb, json.dumps(kwargs, separators=(",", ":"), sort_keys=True))
        return 0
    if args.stage == "report":
        write_reports(out, args.choose)
        print((out / "selection.md").read_text())
        return 0
    protocol = build_protocol(QUICK_NAME if args.quick else PROTOCOL_NAME, QUICK_VAL if args.quick else VAL_PROTOCOL)
    split = validation_split(protocol["recipe"])
    if args.stage == "select":
        labels = list(args.values or CANDIDATES) + list(args.combine)
        if DEFAULT not in labels:
            labels.insert(0, DEFAULT)
        seeds = args.seeds or (1 if args.quick else SELECT_SEEDS)
    else:
        sel = read_json(out / "selection.json")
        chosen = args.choose or (sel or {}).get("chosen")
        if chosen is None:
            raise ValueError(f"choose: no selection yet in {out / 'selection.json'}; run 'select' or pass --choose")
        labels = list(dict.fromkeys((chosen, *filter(None, [best_scale(sel or {})]), DEFAULT, *BASELINES)))
        seeds = args.seeds or (1 if args.quick else CONFIRM_SEEDS)
    for lb in labels:
        combination(lb)
    start = time.perf_counter()
    run_cells(labels, list(range(seeds)), protocol=protocol, out=out, runs=runs, jobs=args.jobs, split=split)
    done = write_reports(out, args.choose if args.stage == "confirm" else None)
    print(selection_markdown(done["selection"]))
    if "confirmation" in done:
        print("\n" + confirmation_markdown(done["confirmation"]))
    print(f"\n{_fmt_time(time.perf_counter() - start)}; wrote {out}/", flush=True)
    return 0


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.stage == "list":
        for lb, (attn, kw) in {**CANDIDATES, **BASELINES}.items():
            print(f"{lb:18s} {attn:9s} {kw or UNSCALED}{'   [confirmation only]' if lb in BASELINES else ''}")
        return 0
    return run_command("accuracy", lambda: _stage(args))


if __name__ == "__main__":
    raise SystemExit(main())
