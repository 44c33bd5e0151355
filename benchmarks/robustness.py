"""Numerical robustness and crash-safety measurements (docs/RELIABILITY.md).

    .venv/bin/python -m benchmarks.robustness            # full run: runs/bench/robustness/robustness.{json,md,png}
    .venv/bin/python -m benchmarks.robustness --publish  # the same into benchmarks/results/
    .venv/bin/python -m benchmarks.robustness --quick    # fewer kills, a smoke run

Three parts:
1. Solvers on ill-conditioned landmark matrices: W = k(L, L) for a 7×7 landmark grid whose spacing is
   chosen so that cond(W) = 1e1 … 1e8 (near-duplicate landmarks at the high end), solved for
   (W + eps·I)^{-1} with eps in {0.01 (default), 0}, Newton–Schulz and CG at several iteration counts,
   float32 and float64. Reported: finite, residual ||I - P V||_F, error vs the float64 inverse, and
   ||V||_2 / ||P^{-1}||_2 (<= 1: an unconverged iterate damps the small eigenvalues, never amplifies).
2. ``laplacian_attention`` end to end on degenerate inputs (random, all-equal tokens, near-duplicate
   landmarks, two clusters, scale 1e4, scale 1e-6) × dtypes × normalisations × solvers, forward and
   backward: finite output and gradients, solver residual, error vs the float64 exact-solver run.
3. Checkpoints: a forked writer saving ever-newer checkpoints is SIGKILLed at random moments; after each
   kill the latest checkpoint must load and be self-consistent.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
import tempfile
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.bench.report import markdown_table, plot_loglog, write_json, write_text

# the fault-injection and ill-conditioned cases of the test suite: this benchmark runs from a checkout only
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "reliability"))

from fault_cases import slow_saving_loop  # noqa: E402
from numerics_cases import (  # noqa: E402
    CASES,
    CONDITION_NUMBERS,
    attention_report,
    landmark_kernel_with_condition,
    solver_report,
)

DTYPES = {"float64": torch.float64, "float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
NORMS = ("injective", "inline", "rowsum", "none")
SOLVER_ITERS = (20, 30, 40, 100)


def solver_part() -> list[dict]:
    rows = []
    grid = [(k, eps, s, it, dt) for k in CONDITION_NUMBERS for eps in (0.01, 0.0) for s in ("newton_schulz", "cg")
            for it in SOLVER_ITERS for dt in ("float32", "float64")]
    mats = {k: landmark_kernel_with_condition(k) for k in CONDITION_NUMBERS}
    for kappa, eps, solver, iters, dt in tqdm(grid, desc="solvers"):
        rep = solver_report(mats[kappa], solver=solver, eps=eps, iters=iters, dtype=DTYPES[dt])
        p = mats[kappa] + eps * torch.eye(mats[kappa].shape[0], dtype=torch.float64)
        rows.append({"cond_W": kappa, "cond_P": torch.linalg.cond(p).item(), "eps": eps, "solver": solver,
                     "iters": iters, "dtype": dt, **rep})
    return rows


def attention_part() -> list[dict]:
    rows = []
    grid = [(c, dt, n, s) for c in CASES for dt in DTYPES for n in NORMS for s in ("newton_schulz", "cg")]
    for case, dt, norm, solver in tqdm(grid, desc="attention"):
        rep = attention_report(case, dtype=DTYPES[dt], norm=norm, solver=solver, hw=(14, 14), landmarks=(7, 7))
        rows.append({"case": case, "dtype": dt, "norm": norm, "solver": solver, **rep})
    return rows


def kill_part(trials: int, seed: int = 0) -> dict:
    from laplacianformer.checkpoint import CheckpointError, load_checkpoint, previous_path, save_checkpoint

    rng = random.Random(seed)
    counts = {"trials": trials, "latest_ok": 0, "latest_corrupt": 0, "prev_exists": 0, "prev_ok": 0,
              "killed_mid_write": 0, "steps_completed": 0}
    with tempfile.TemporaryDirectory() as root:
        for trial in tqdm(range(trials), desc="SIGKILL trials"):
            path = Path(root) / f"t{trial}" / "c.pt"
            path.parent.mkdir()
            save_checkpoint({"step": 0, "w": torch.zeros(1 << 20)}, path)
            pid = os.fork()
            if pid == 0:
                try:
                    slow_saving_loop(path, 0.001)
                finally:
                    os._exit(1)
            time.sleep(rng.uniform(0.02, 0.5))
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            try:
                latest = load_checkpoint(path)
                ok = torch.equal(latest["w"], torch.full((1 << 20,), float(latest["step"])))
                counts["steps_completed"] += latest["step"]
            except CheckpointError:
                ok = False
            counts["latest_ok" if ok else "latest_corrupt"] += 1
            if previous_path(path).exists():
                counts["prev_exists"] += 1
                try:
                    load_checkpoint(previous_path(path))
                    counts["prev_ok"] += 1
                except CheckpointError:
                    pass
            counts["killed_mid_write"] += any(p.suffix == ".tmp" for p in path.parent.iterdir())
    return counts


def _fmt(x) -> str:
    if isinstance(x, bool):
        return "yes" if x else "**NO**"
    if isinstance(x, float):
        return f"{x:.2e}"
    return str(x)


def report(solvers: list[dict], attention: list[dict], kills: dict) -> str:
    lines = ["# Robustness measurements", "", "Produced by `python -m benchmarks.robustness`; see docs/RELIABILITY.md.", ""]
    lines += ["## 1. Regularised inverse on 7×7-grid Laplacian landmark matrices (m = 49)", ""]
    header = ["cond(W)", "eps", "cond(P)", "solver", "dtype"] + [f"residual @{i}" for i in SOLVER_ITERS] + \
        ["max ||V||/||P⁻¹||", "all finite"]
    rows = []
    keyed = {}
    for r in solvers:
        keyed.setdefault((r["cond_W"], r["eps"], r["solver"], r["dtype"]), []).append(r)
    for (kappa, eps, solver, dt), group in keyed.items():
        by_it = {r["iters"]: r for r in group}
        rows.append([f"{kappa:.0e}", eps, _fmt(group[0]["cond_P"]), solver, dt]
                    + [_fmt(by_it[i].get("residual", float("nan"))) for i in SOLVER_ITERS]
                    + [_fmt(max(r.get("norm_ratio", float("nan")) for r in group)), _fmt(all(r["finite"] for r in group))])
    lines.append(markdown_table(header, rows))
    lines += ["## 2. laplacian_attention end to end (B=2, H=2, 14×14 tokens, d=16, 7×7 landmarks, 20 iterations)", ""]
    header = ["case", "norm", "solver"] + [f"{dt}: finite out/grad, err" for dt in DTYPES] + ["NS/CG residual (fp32)"]
    rows = []
    keyed = {}
    for r in attention:
        keyed.setdefault((r["case"], r["norm"], r["solver"]), {})[r["dtype"]] = r
    for (case, norm, solver), by_dt in keyed.items():
        cells = [f"{_fmt(r['finite'])}/{_fmt(r['finite_grad'])}, {_fmt(r['rel_err'])}" for r in by_dt.values()]
        rows.append([case, norm, solver, *cells, _fmt(by_dt["float32"]["residual"])])
    lines.append(markdown_table(header, rows))
    nonfinite = [r for r in attention if not (r["finite"] and r["finite_grad"])]
    lines += [f"Configurations run: {len(attention)} (forward + backward); non-finite: {len(nonfinite)}"
              + (" — " + ", ".join(sorted({f"{r['case']}/{r['norm']}" for r in nonfinite})) if nonfinite else ""), ""]
    lines += ["## 3. SIGKILL during save_checkpoint", "", markdown_table(list(kills), [list(kills.values())])]
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="10 SIGKILL trials instead of 60")
    add_output_options(parser)
    args = parser.parse_args(argv)
    stem = output_stem(args, "robustness", "robustness")
    torch.manual_seed(0)
    solvers = solver_part()
    attention = attention_part()
    kills = kill_part(10 if args.quick else 60)
    settings = {"condition_numbers": list(CONDITION_NUMBERS), "iters": list(SOLVER_ITERS), "cases": list(CASES),
                "dtypes": list(DTYPES), "norms": list(NORMS), "kill_trials": kills["trials"]}
    write_json(stem.with_suffix(".json"), {"solvers": solvers, "attention": attention, "kills": kills},
               settings=settings)
    text = report(solvers, attention, kills)
    write_text(stem.with_suffix(".md"), text)
    series = {}
    for r in solvers:
        if r["solver"] == "newton_schulz" and r["dtype"] == "float32" and r["iters"] in (20, 40):
            series.setdefault(f"NS {r['iters']} it, eps={r['eps']}", ([], []))
            series[f"NS {r['iters']} it, eps={r['eps']}"][0].append(r["cond_W"])
            series[f"NS {r['iters']} it, eps={r['eps']}"][1].append(r.get("residual"))
    plot_loglog(stem.with_suffix(".png"), [{"ylabel": "||I - P V||_F (float32)", "series": series}],
                xlabel="cond(W) of the 7×7 landmark kernel matrix", title="Newton–Schulz residual vs conditioning")
    print(text)


if __name__ == "__main__":
    main()
