"""The CPU allocator settings side by side: glibc's defaults, ``laplacianformer.retain_freed_memory()`` (run time)
and ``heap.RETAINED_HEAP_ENV`` (start-up), for one model's inference (issue 42, docs/DEPLOY.md "The allocator").

    python -m benchmarks.allocator_ab                       # Tiny, 512² and 1024², 2 threads, 3 rounds
    python -m benchmarks.allocator_ab --sizes 1024 --rounds 5 --out benchmarks/results/allocator_ab

Repository only (not in the wheel): run from the checkout's root. Each (setting, size, round) is a fresh
process: the model (random weights, seed 0), 2 warm-up forwards, then ``--calls`` timed forwards under no_grad;
the process reports their median and its minor page faults per forward. Rounds visit the settings in turn, so
machine load hits them alike; the table gives the median over rounds and each setting's time relative to the
defaults in the same round (median and range of those ratios). Writes OUT.json and OUT.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from laplacianformer.heap import RETAINED_HEAP_ENV

SETTINGS = ("default", "retain_freed_memory", "environment")

CHILD = """
import json, resource, sys, time, torch
import laplacianformer
model, size, threads, calls, setting = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
took = laplacianformer.retain_freed_memory() if setting == "retain_freed_memory" else None
torch.manual_seed(0)
torch.set_num_threads(threads)
net = laplacianformer.create_model(model).eval()
x = torch.randn(1, 3, size, size)
with torch.no_grad():
    for _ in range(2):
        net(x)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        net(x)
        times.append(time.perf_counter() - start)
    faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / calls
print(json.dumps(dict(ms=1e3 * sorted(times)[len(times) // 2], faults_per_call=faults, took=took)))
"""


def run_one(model: str, size: int, threads: int, calls: int, setting: str) -> dict:
    env = {**os.environ, **(RETAINED_HEAP_ENV if setting == "environment" else {})}
    if setting != "environment":
        for key in RETAINED_HEAP_ENV:
            env.pop(key, None)
    out = subprocess.run([sys.executable, "-c", CHILD, model, str(size), str(threads), str(calls), setting],
                         capture_output=True, text=True, check=True, env=env)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="laplacianformer_tiny")
    ap.add_argument("--sizes", type=int, nargs="+", default=[512, 1024])
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--calls", type=int, default=5, help="timed forwards per process")
    ap.add_argument("--rounds", type=int, default=3, help="fresh processes per (setting, size)")
    ap.add_argument("--out", type=Path, default=Path("runs/bench/allocator_ab/allocator_ab"))
    args = ap.parse_args(argv)
    rows = []
    for size in args.sizes:
        runs = {s: [] for s in SETTINGS}
        for r in range(args.rounds):
            for setting in SETTINGS:
                runs[setting].append(run_one(args.model, size, args.threads, args.calls, setting))
                print(f"{size}² round {r + 1} {setting}: {runs[setting][-1]['ms']:.1f} ms, "
                      f"{runs[setting][-1]['faults_per_call']:.0f} faults per forward", flush=True)
        for setting in SETTINGS:
            ratios = [a["ms"] / b["ms"] for a, b in zip(runs[setting], runs["default"])]
            rows.append(dict(size=size, setting=setting, median_ms=statistics.median(x["ms"] for x in runs[setting]),
                             faults_per_call=statistics.median(x["faults_per_call"] for x in runs[setting]),
                             ratio_median=statistics.median(ratios), ratio_min=min(ratios), ratio_max=max(ratios),
                             runs=runs[setting]))
    lines = [f"# {args.model}: inference under each CPU allocator setting ({args.threads} threads, batch 1, "
             f"{args.rounds} rounds of fresh processes, {args.calls} timed forwards each)", "",
             "| size | setting | median ms | × defaults (median, range) | minor faults per forward |",
             "|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['size']}² | {r['setting']} | {r['median_ms']:.1f} | {r['ratio_median']:.2f} "
                     f"({r['ratio_min']:.2f}–{r['ratio_max']:.2f}) | {r['faults_per_call']:,.0f} |")
    table = "\n".join(lines) + "\n"
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".md").write_text(table)
    args.out.with_suffix(".json").write_text(json.dumps(dict(
        command="python -m benchmarks.allocator_ab " + " ".join(sys.argv[1:] if argv is None else argv),
        settings=vars(args) | {"out": str(args.out)}, rows=rows), indent=1) + "\n")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
