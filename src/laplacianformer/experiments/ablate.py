"""``laplacianformer ablate NAME``: train the micro model once per (value, seed) and decide the claims
(docs/DESIGN.md §7, ablations and evidence).

Every cell is one ``laplacianformer.train.train`` run with the fixed recipe of ``protocol.PROTOCOL`` and
one setting changed (``ablations.ABLATIONS``).  ``OUT/NAME.json`` is rewritten after each cell with the
protocol, the cells, the paired summary, the verdicts and ``complete`` (false while cells are missing);
``OUT/NAME.md`` and ``OUT/NAME.png`` carry the same status.  A rerun skips recorded cells (resume); cells
of an identical model are shared between ablations; a file of another protocol (or a legacy file of the
old small-budget runs, which has no ``protocol``) is never mixed with this one.

``--target-halfwidth P --max-seeds K`` adds seeds 0, 1, 2, ... to every value until each paired 95 % CI
versus the default is at most P points wide on each side, or K seeds are recorded.  ``--jobs J`` runs J
cells at once, each in its own single-threaded process.  ``--quick`` is the smoke test (3 steps on 128
images, 2 values): its numbers are NOT results (the JSON says ``"smoke_test": true``).

In the background (progress is one flushed line per cell, with an ETA):

    nohup laplacianformer ablate lambda --target-halfwidth 0.5 --max-seeds 12 --jobs 2 > ablate-lambda.log 2>&1 &

SIGTERM/Ctrl-C stop the running cells (not recorded); the same command resumes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path

from .ablations import ABLATIONS, Ablation, get_ablation, operator_support, resolve_variant
from .common import environment, jsonable as _jsonable, read_json, run_command, write_json
from .evidence import ablation_of, finalise, markdown, plot, sibling_pool, summarise
from ..train.geometry import MIN_TOKENS_PER_LANDMARK, check_geometry, geometry
from .protocol import (
    PROTOCOL, PROTOCOL_NAME, QUICK, QUICK_NAME, cell_attn_kwargs, protocol_diff, protocol_record, recipe, same_protocol,
)

DEFAULT_SEEDS = 3
DEFAULT_OUT = "results/ablations"
QUICK_OUT = "runs/ablations-quick"
DEFAULT_RUNS = "runs/ablations"
REPORT_EVERY_S = 30.0
_KEEP = ("top1", "top5", "loss", "images_per_s", "params", "wall_time_s", "train_time_s", "steps",
         "epochs_completed", "history", "peak_memory_mb", "run_dir")


def build_protocol(name: str, overrides: dict) -> dict:
    """The ``protocol`` block (no seeds yet) of a recipe; ValueError when stage 1 has too few tokens."""
    rec = recipe(overrides)
    geom = geometry(rec)
    check_geometry(geom, rec)
    block = protocol_record(name, rec, geom, [])
    block["head_dim"] = geom["head_dim"]
    return json.loads(json.dumps(_jsonable(block)))


def cell_key(label: str, seed: int) -> str:
    return f"{label}|seed={seed}"


def canonical_attention(attn: str, attn_kwargs: dict, head_dim: int | None) -> dict:
    """The attention settings with every default filled in (lam and qk_scale None -> the kernel's defaults,
    ``ops.default_bandwidth``, when d is known), so that two variants that build the same model compare equal."""
    import inspect

    from ..layers.laplacian_attention import LaplacianAttention
    from ..layers.token_attention import TokenAttention
    from ..layers.token_mixer import LAPLACIAN_ATTN_KWARGS, LAPLACIAN_MODULE_KWARGS
    from ..ops.settings import DEFAULTS

    if attn == "softmax":
        return {"attn": attn, **attn_kwargs}
    # the module's own defaults (dwconv), then the shell's it passes through (tie_qk, recompute, ...)
    params = {**inspect.signature(TokenAttention.__init__).parameters,
              **inspect.signature(LaplacianAttention.__init__).parameters}
    defaults = {**DEFAULTS, **{k: params[k].default for k in LAPLACIAN_MODULE_KWARGS}}
    full = {k: defaults[k] for k in LAPLACIAN_ATTN_KWARGS}
    full.update(cell_attn_kwargs(attn, attn_kwargs))
    if head_dim is not None:
        from ..ops import default_bandwidth

        full["lam"], full["qk_scale"] = default_bandwidth(attn, head_dim, full.get("lam"), full.get("qk_scale"))
    full = {k: list(v) if isinstance(v, tuple) else v for k, v in full.items()}
    return {"attn": attn, **_jsonable(full)}


def find_same_cell(out: Path, protocol: dict, config: dict, seed: int, head_dim: int | None) -> tuple[str, dict] | None:
    """A cell recorded in any OUT/*.json of the same protocol whose model is identical to ``config``:
    the ablations share their default value, so its run is trained once.  Returns (where, cell) or None."""
    for path in sorted(out.glob("*.json")):
        rec = read_json(path)
        if not isinstance(rec, dict) or not same_protocol(rec.get("protocol"), protocol):
            continue
        for key, cell in rec.get("cells", {}).items():
            if cell.get("seed") == seed and "reused_from" not in cell and \
                    canonical_attention(cell["attn"], cell["attn_kwargs"], head_dim) == config:
                return f"{rec['ablation']}/{key}", cell
    return None


def _open_record(ablation: Ablation, path: Path, protocol: dict, smoke_test: bool, fresh: bool) -> dict:
    old = read_json(path)
    if isinstance(old, dict) and "protocol" not in old:
        base = (old.get("settings") or {}).get("base", {})
        raise ValueError(
            f"out: {path} holds a legacy record of the old small-budget runs (no protocol block; "
            f"{base.get('train_subset')} train images, {base.get('epochs')} epochs); it is neither mixed with "
            f"protocol {protocol['name']!r} nor overwritten (not even with --fresh): move it away "
            f"(e.g. to {path.parent / 'legacy'}/) or choose another --out"
        )
    if old is not None and not fresh and not same_protocol(old.get("protocol"), protocol):
        diff = protocol_diff(old.get("protocol") or {}, protocol)
        raise ValueError(f"out: {path} was recorded under another protocol ({'; '.join(diff[:6])}); "
                         "pass --fresh to overwrite it or choose another --out")
    if old is None or fresh:
        old = {"ablation": ablation.name, "setting": ablation.setting, "question": ablation.question,
               "default": ablation.default, "protocol": {**protocol, "seeds": []}, "smoke_test": smoke_test,
               "environment": environment(), "resolved": {}, "unsupported": {}, "cells": {}}
    old.setdefault("resolved", {})
    old.setdefault("unsupported", {})
    return old


class CellRunner:
    """Runs cells: in this process (``jobs`` = 1), in threads (an injected ``train_fn``), or in
    single-threaded subprocesses (``jobs`` > 1).  ``run(items)`` yields (item, result, seconds) as cells finish."""

    CELL_COMMAND = (sys.executable, "-m", "laplacianformer.experiments.cell")

    def __init__(self, jobs: int = 1, train_fn=None, command=None):
        if jobs < 1:
            raise ValueError(f"jobs: expected >= 1, got {jobs}")
        self.jobs, self.train_fn = jobs, train_fn
        self.command = list(command or self.CELL_COMMAND)  # + [CONFIG.json, RESULT.json]
        self._procs: set[subprocess.Popen] = set()
        self._lock = threading.Lock()

    def _one(self, config: dict) -> dict:
        if self.train_fn is not None:
            return self.train_fn(config)
        if self.jobs == 1:
            from .cell import run_cell

            return run_cell(config)
        return self._subprocess(config)

    def _subprocess(self, config: dict) -> dict:
        run_dir = Path(config["out"])
        run_dir.mkdir(parents=True, exist_ok=True)
        cfg_path, res_path, log_path = run_dir / "cell-config.json", run_dir / "cell-result.json", run_dir / "cell.log"
        write_json(cfg_path, config)
        if res_path.exists():
            res_path.unlink()
        root = str(Path(__file__).resolve().parents[2])
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
               "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
        with open(log_path, "w") as log:
            proc = subprocess.Popen([*self.command, str(cfg_path), str(res_path)],
                                    stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
            with self._lock:
                self._procs.add(proc)
            try:
                rc = proc.wait()
            finally:
                with self._lock:
                    self._procs.discard(proc)
        result = read_json(res_path)
        if rc != 0 or result is None:
            tail = log_path.read_text()[-2000:] if log_path.exists() else ""
            if rc in (-signal.SIGTERM, -signal.SIGINT):
                return {"interrupted": f"signal {-rc}"}
            raise RuntimeError(f"cell {run_dir} failed (exit {rc}); log {log_path}:\n{tail}")
        return result

    def stop(self) -> None:
        """SIGTERM to the cell processes this runner started (they stop training and report interrupted)."""
        with self._lock:
            procs = list(self._procs)
        for p in procs:
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)

    def run(self, items: list):
        """items: [(key, config)] -> yields (key, result, seconds) in completion order."""
        if self.jobs == 1:
            for key, config in items:
                start = time.perf_counter()
                yield key, self._one(config), time.perf_counter() - start
            return
        pool = ThreadPoolExecutor(max_workers=self.jobs)
        pending = {}
        installed = threading.current_thread() is threading.main_thread()
        old_term = signal.signal(signal.SIGTERM, _raise_interrupt) if installed else None
        try:
            queue = list(items)
            while queue or pending:
                while queue and len(pending) < self.jobs:
                    key, config = queue.pop(0)
                    pending[pool.submit(self._timed, config)] = key
                done, _ = wait(list(pending), return_when=FIRST_COMPLETED)
                for fut in done:
                    key = pending.pop(fut)
                    result, secs = fut.result()
                    yield key, result, secs
        finally:
            self.stop()
            pool.shutdown(wait=True, cancel_futures=True)
            if installed:
                signal.signal(signal.SIGTERM, old_term if old_term is not None else signal.SIG_DFL)

    def _timed(self, config):
        start = time.perf_counter()
        return self._one(config), time.perf_counter() - start


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt(signal.Signals(signum).name)


def _fmt_time(s: float) -> str:
    s = int(round(s))
    return f"{s // 3600}h{s % 3600 // 60:02d}m" if s >= 3600 else f"{s // 60}m{s % 60:02d}s"


def _save(path: Path, record: dict, ablation: Ablation, out: Path, on_save) -> None:
    finalise(record, ablation, sibling_pool(out, record))
    write_json(path, record)
    if on_save is not None:
        on_save(record)


def run_ablation(
    ablation: Ablation,
    *,
    protocol: dict,
    seeds: list[int],
    labels: list[str],
    out: Path,
    smoke_test: bool,
    runs: Path | None = None,
    fresh: bool = False,
    progress: bool = True,
    train_fn=None,
    jobs: int = 1,
    timing_fn=None,
    on_save=None,
    cell_command=None,
) -> dict:
    """Runs the missing (value, seed) cells of ``ablation`` and returns the record saved in OUT/NAME.json.

    ``protocol``: a block from ``build_protocol``.  Each cell's run directory is RUNS/NAME/LABEL-sSEED.
    ``train_fn`` replaces ``train(TrainConfig(**config))`` (tests); ``timing_fn(recipe)`` replaces
    ``solver_timing.cg_iters_at_ns_time``; ``on_save(record)`` is called after every write (Markdown, plot)."""
    if protocol["stage1_tokens"] < MIN_TOKENS_PER_LANDMARK * protocol["landmarks"]:
        check_geometry({"stage1_tokens": protocol["stage1_tokens"], "landmarks": protocol["landmarks"]}, protocol["recipe"])
    out = Path(out)
    path = out / f"{ablation.name}.json"
    record = _open_record(ablation, path, protocol, smoke_test, fresh)
    record["protocol"]["seeds"] = sorted(set(record["protocol"].get("seeds", [])) | set(seeds))
    head_dim = protocol.get("head_dim")
    base = protocol["recipe"]
    if any(ablation.variant(lb).cg_at_ns_time for lb in labels) and "cg_equal_time" not in record["resolved"]:
        if timing_fn is None:
            from .solver_timing import cg_iters_at_ns_time as timing_fn
        say = print if progress else (lambda *a, **k: None)
        say(f"ablate {ablation.name}: timing NS vs CG on the model's landmark matrices ...", flush=True)
        record["resolved"]["cg_equal_time"] = _jsonable(timing_fn(base))
        say(f"ablate {ablation.name}: CG at NS's wall time = {record['resolved']['cg_equal_time']['cg_iters']} iterations",
            flush=True)
    cg_iters = record["resolved"].get("cg_equal_time", {}).get("cg_iters")
    fields = {}
    for lb in labels:
        fields[lb] = resolve_variant(ablation.variant(lb), head_dim, cg_iters)
        why = operator_support(fields[lb])
        if why:
            if lb not in record["unsupported"] and progress:
                print(f"ablate {ablation.name}: {lb}: {why}; skipped", flush=True)
            record["unsupported"][lb] = why
        else:
            record["unsupported"].pop(lb, None)
    todo = [(lb, s) for s in seeds for lb in labels
            if cell_key(lb, s) not in record["cells"] and lb not in record["unsupported"]]
    items = []
    for lb, seed in todo:
        f = fields[lb]
        canonical = canonical_attention(f["attn"], f["attn_kwargs"], head_dim)
        same = find_same_cell(out, record["protocol"], canonical, seed, head_dim)
        if same is not None:
            record["cells"][cell_key(lb, seed)] = {**same[1], "label": lb, "attn_kwargs": _jsonable(f["attn_kwargs"]),
                                                   "reused_from": same[0]}
            if progress:
                print(f"ablate {ablation.name}: {lb} seed {seed}: reused {same[0]}", flush=True)
            continue
        run_dir = Path(runs or out / "runs") / ablation.name / f"{lb}-s{seed}"
        config = {**base, **f, "model_kwargs": {**(base.get("model_kwargs") or {}), **f["model_kwargs"]},
                  "seed": seed, "progress": False, "out": str(run_dir)}
        items.append((cell_key(lb, seed), config))
    _save(path, record, ablation, out, None)
    runner = CellRunner(jobs, train_fn, cell_command)
    times: list[float] = []
    for i, (key, result, secs) in enumerate(runner.run(items), 1):
        label, seed = key.split("|seed=")[0], int(key.split("|seed=")[1])
        if result.get("interrupted"):
            _save(path, record, ablation, out, on_save)
            raise KeyboardInterrupt(f"training of {label} seed {seed} was interrupted ({result['interrupted']}); "
                                    "that cell is not recorded, rerun the same command to resume")
        f = fields[label]
        cell = {k: _jsonable(result[k]) for k in _KEEP if k in result}
        cell["top1"] = _jsonable(result["top1"])
        cell.update({"label": label, "seed": seed, "attn": f["attn"], "attn_kwargs": _jsonable(f["attn_kwargs"]),
                     "seconds": round(secs, 2)})
        record["cells"][key] = cell
        _save(path, record, ablation, out, on_save)
        times.append(secs)
        if progress:
            left = len(items) - i
            eta = left * (sum(times) / len(times)) / min(jobs, max(left, 1))
            print(f"[{ablation.name} {i}/{len(items)}] {label} seed {seed}: top-1 {100 * float(result['top1']):.2f} % "
                  f"in {_fmt_time(secs)}; {left} left, ETA {_fmt_time(eta)} ({jobs} job{'s' * (jobs > 1)})", flush=True)
    _save(path, record, ablation, out, None)
    return record


def halfwidths(record: dict, labels: list[str]) -> dict[str, float | None]:
    """Paired 95 % CI half-width vs the default of each non-default value in ``labels`` (None: no CI)."""
    summary = record.get("summary") or summarise(record, ABLATIONS.get(record["ablation"]))
    return {lb: (summary.get(lb) or {}).get("paired_halfwidth") for lb in labels
            if lb != record["default"] and lb not in record.get("unsupported", {})}


def grow_seeds(ablation: Ablation, *, target_halfwidth: float, max_seeds: int, start_seeds: int = DEFAULT_SEEDS,
               labels: list[str], progress: bool = True, on_save=None, **kw) -> dict:
    """Adds seeds 0, 1, 2, ... to every value until each paired CI half-width (fraction) vs the default is
    ≤ ``target_halfwidth`` or ``max_seeds`` seeds are recorded; resumable (recorded cells are skipped)."""
    if target_halfwidth <= 0:
        raise ValueError(f"target_halfwidth: expected > 0, got {target_halfwidth}")
    if max_seeds < 2:
        raise ValueError(f"max_seeds: expected >= 2 (a CI needs two seeds), got {max_seeds}")
    if ablation.default not in labels:
        raise ValueError(f"values: the seed loop compares with the default {ablation.default!r}; include it")
    n = max(2, min(start_seeds, max_seeds))
    recorded = read_json(Path(kw["out"]) / f"{ablation.name}.json")
    if isinstance(recorded, dict) and not kw.get("fresh") and same_protocol(recorded.get("protocol"), kw["protocol"]):
        active = [lb for lb in labels if lb not in recorded.get("unsupported", {})]
        done = 0  # resume after the last complete round of seeds
        while done < max_seeds and all(cell_key(lb, done) in recorded["cells"] for lb in active):
            done += 1
        n = max(n, done)
    policy = {"target_halfwidth": target_halfwidth, "max_seeds": max_seeds}
    while True:
        record = run_ablation(ablation, seeds=list(range(n)), labels=labels, progress=progress, on_save=on_save, **kw)
        kw["fresh"] = False  # discard old cells once, not every round
        widths = halfwidths(record, labels)
        wide = {lb: w for lb, w in widths.items() if w is None or w > target_halfwidth}
        if not wide or n >= max_seeds:
            record["seed_policy"] = {**policy, "met": not wide, "seeds": n,
                                     "halfwidths": {lb: _jsonable(w) for lb, w in widths.items()}}
            write_json(Path(kw["out"]) / f"{ablation.name}.json", record)
            if on_save is not None:
                on_save(record)
            if progress:
                state = "met" if not wide else f"NOT met at {max_seeds} seeds ({', '.join(wide)})"
                print(f"ablate {ablation.name}: half-width target ±{100 * target_halfwidth:.2f} points {state}", flush=True)
            return record
        if progress:
            lb, w = max(wide.items(), key=lambda kv: math.inf if kv[1] is None else kv[1])
            wtxt = "no CI" if w is None else f"±{100 * w:.2f} points"
            secs = [c["seconds"] for c in record["cells"].values() if "reused_from" not in c and c.get("seconds")]
            left = (max_seeds - n) * len([x for x in labels if x not in record.get("unsupported", {})])
            bound = f", at most {left} cells ≈ {_fmt_time(left * sum(secs) / len(secs) / kw.get('jobs', 1))}" if secs else ""
            print(f"ablate {ablation.name}: {n} seeds: {len(wide)} CI(s) wider than ±{100 * target_halfwidth:.2f} "
                  f"points (widest {lb}: {wtxt}); adding seed {n}{bound}", flush=True)
        n += 1


def write_report(record: dict, out: Path) -> None:
    """OUT/NAME.md and OUT/NAME.png of a record (any status; legacy files are labelled as such)."""
    ablation = ablation_of(record)
    if "protocol" not in record or "summary" not in record:
        record = {**record, "summary": summarise(record, ablation)}
    (out / f"{record['ablation']}.md").write_text(markdown(record, ablation) + "\n")
    plot(record, ablation, out / f"{record['ablation']}.png")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="laplacianformer ablate",
        description="Run the ablations of docs/DESIGN.md §7 on the micro model under the fixed protocol; "
                    "resumable; paired 95 % CIs and verdicts.",
    )
    p.add_argument("names", nargs="*", help=f"ablations to run: {', '.join(ABLATIONS)} or 'all'")
    p.add_argument("--list", action="store_true", help="list the ablations and their values, then exit")
    p.add_argument("--quick", action="store_true", help="smoke test: tiny budget, 1 seed, 2 values (not a result)")
    p.add_argument("--seeds", type=int, default=None,
                   help=f"seeds 0..N-1 (default {DEFAULT_SEEDS}; 1 with --quick); with --target-halfwidth: the first round")
    p.add_argument("--target-halfwidth", type=float, default=None, metavar="POINTS",
                   help="add seeds until every paired 95%% CI vs the default is within ± POINTS top-1 points (e.g. 0.5)")
    p.add_argument("--max-seeds", type=int, default=12, help="upper bound on seeds with --target-halfwidth (default 12)")
    p.add_argument("--jobs", type=int, default=1, help="cells run at once, each a single-threaded process (default 1)")
    p.add_argument("--values", nargs="+", default=None, help="run only these values (labels as in --list)")
    p.add_argument("--out", default=None, help=f"output directory (default {DEFAULT_OUT}; {QUICK_OUT} with --quick)")
    p.add_argument("--runs", default=None,
                   help=f"root of the per-cell training run directories (default {DEFAULT_RUNS}; OUT/runs with --quick)")
    p.add_argument("--report", action="store_true", help="train nothing: redo summary, verdicts, table and plot from the JSON")
    p.add_argument("--fresh", action="store_true", help="discard recorded cells instead of resuming (never a legacy file)")
    p.add_argument("--no-progress", action="store_true", help="print nothing per cell")
    for flag, typ in (("epochs", int), ("train-subset", int), ("test-subset", int), ("max-steps", int),
                      ("img-size", int), ("batch-size", int), ("lr", float), ("threads", int)):
        p.add_argument(f"--{flag}", type=typ, default=None,
                       help=f"override the protocol's {flag.replace('-', '_')} (makes a different, 'custom' protocol)")
    return p


def _report_only(ablation: Ablation, out: Path) -> dict:
    path = out / f"{ablation.name}.json"
    record = read_json(path)
    if record is None:
        raise ValueError(f"out: {path} does not exist (nothing recorded yet)")
    if "protocol" in record:
        finalise(record, ablation, sibling_pool(out, record))
        write_json(path, record)
    return record


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.list:
        for a in ABLATIONS.values():
            print(f"{a.name:10s} {a.setting:10s} {', '.join(a.labels):60s} {a.question}")
        return 0
    if not args.names:
        print("ablate: name: expected one or more of " + ", ".join(ABLATIONS) + " or 'all' (see --list)", file=sys.stderr)
        return 2
    names = list(ABLATIONS) if "all" in args.names else args.names
    overrides = {k: getattr(args, k) for k in ("epochs", "train_subset", "test_subset", "max_steps", "img_size",
                                                "batch_size", "lr", "threads") if getattr(args, k) is not None}
    name = (QUICK_NAME if args.quick else PROTOCOL_NAME) + ("+custom" if overrides else "")
    out = Path(args.out or (QUICK_OUT if args.quick else DEFAULT_OUT))
    try:
        ablations = [get_ablation(n) for n in names]
        if args.jobs < 1:
            raise ValueError(f"jobs: expected >= 1, got {args.jobs}")
        protocol = None if args.report else build_protocol(name, {**(QUICK if args.quick else PROTOCOL), **overrides})
    except ValueError as exc:
        print(f"ablate: {exc}", file=sys.stderr)
        return 2
    for ablation in ablations:
        last = [time.monotonic()]

        def on_save(record, _out=out, _last=last):
            if time.monotonic() - _last[0] >= REPORT_EVERY_S:  # the Markdown and plot of a partial run
                write_report(record, _out)
                _last[0] = time.monotonic()

        def body(ablation=ablation, on_save=on_save) -> int:
            labels = args.values or (list(ablation.quick) if args.quick else ablation.labels)
            for lb in labels:
                ablation.variant(lb)
            if args.report:
                record = _report_only(ablation, out)
            else:
                common = dict(protocol=protocol, labels=labels, out=out, smoke_test=args.quick, fresh=args.fresh,
                              runs=Path(args.runs or (out / "runs" if args.quick else DEFAULT_RUNS)),
                              progress=not args.no_progress, jobs=args.jobs, on_save=on_save)
                start = args.seeds or (1 if args.quick else DEFAULT_SEEDS)
                if args.target_halfwidth is not None:
                    record = grow_seeds(ablation, target_halfwidth=args.target_halfwidth / 100.0,
                                        max_seeds=args.max_seeds, start_seeds=max(start, 2), **common)
                else:
                    record = run_ablation(ablation, seeds=list(range(start)), **common)
            write_report(record, out)
            print(f"\n{markdown(record, ablation)}\nwrote {out / (ablation.name + '.json')}, .md, .png", flush=True)
            return 0

        code = run_command("ablate", body)
        if code:
            return code
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
