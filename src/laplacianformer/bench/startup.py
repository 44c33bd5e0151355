"""Start-up cost: wall seconds of fresh interpreters that import torch, this package, timm after it, and run
``laplacianformer --help`` (issue 42 item 3), and the heavy modules ``import laplacianformer`` loads.

    python -m laplacianformer.bench.startup [--repeats 7]

The commands run in turn (one round: each once, after one warm-up round not counted) so that a change of
machine load moves them alike; the table gives each median wall and CPU (user + system) time and their
excess over ``import torch`` (CPU time moves less with the load of a shared machine).
Writes runs/bench/startup/startup.{json,md}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time

from .options import load_record
from .output import add_output_options, output_stem
from .process import package_env
from .report import markdown_table, write_json, write_text

HEAVY = ("torch._dynamo", "torch._inductor", "timm", "torchvision", "onnx", "triton")
"""Modules ``import laplacianformer`` leaves out until used (tests/test_startup.py)."""

COMMANDS = {
    "import torch": ["-c", "import torch"],
    "import laplacianformer": ["-c", "import laplacianformer"],
    "import laplacianformer, timm; timm.create_model(micro)": [
        "-c", "import laplacianformer, timm; timm.create_model('laplacianformer_micro')"],
    "laplacianformer --help": ["-m", "laplacianformer", "--help"],
}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def seconds(argv: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall, CPU) seconds of ``python argv`` in a fresh interpreter."""
    c0, t0 = _children_cpu(), time.perf_counter()
    subprocess.run([sys.executable, *argv], env=env, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, _children_cpu() - c0


def loaded_heavy(env: dict[str, str]) -> list[str]:
    code = f"import sys, laplacianformer; print(*[m for m in {HEAVY!r} if m in sys.modules])"
    return subprocess.run([sys.executable, "-c", code], env=env, check=True, capture_output=True,
                          text=True).stdout.split()


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7, help="counted rounds (default 7)")
    add_output_options(p)
    args = p.parse_args(argv)
    stem = output_stem(args, "startup", "startup")
    env = package_env()
    load_before = os.getloadavg()
    runs: dict[str, list[tuple[float, float]]] = {name: [] for name in COMMANDS}
    for round_ in range(args.repeats + 1):
        for name, cmd in COMMANDS.items():
            t = seconds(cmd, env)
            if round_:
                runs[name].append(t)
    load = load_record(load_before)
    rows = []
    for name, ts in runs.items():
        wall, cpu = (statistics.median(t[i] for t in ts) for i in (0, 1))
        rows.append(dict(command=name, wall_s=wall, cpu_s=cpu, wall_min_s=min(t[0] for t in ts),
                         wall_max_s=max(t[0] for t in ts), runs=ts))
    base = next(r for r in rows if r["command"] == "import torch")
    for row in rows:
        row["wall_over_torch_s"] = row["wall_s"] - base["wall_s"]
        row["cpu_over_torch_s"] = row["cpu_s"] - base["cpu_s"]
    heavy = loaded_heavy(env)
    write_json(stem.with_suffix(".json"), dict(rows=rows, heavy_loaded=heavy, load=load), settings=vars(args))
    text = (f"# Start-up: seconds of a fresh interpreter (medians of {args.repeats} rounds, in turn)\n\n"
            f"Load average (1 min) before/after: {load['before'][0]:.1f} / {load['after'][0]:.1f} on "
            f"{load['cpus']} CPUs. Heavy modules after `import laplacianformer`: {', '.join(heavy) or 'none'}.\n\n")
    text += markdown_table(
        ["command", "wall s", "wall min-max s", "wall over import torch s", "CPU s", "CPU over import torch s"],
        [[r["command"], r["wall_s"], f"{r['wall_min_s']:.2f}-{r['wall_max_s']:.2f}", r["wall_over_torch_s"],
          r["cpu_s"], r["cpu_over_torch_s"]] for r in rows])
    write_text(stem.with_suffix(".md"), text)
    print(text)


if __name__ == "__main__":
    main()
