"""The benchmarks of ``laplacianformer bench``: their names, one-line descriptions and smoke-test arguments,
and the runner that starts each one as ``python -m laplacianformer.bench.NAME`` in the current directory."""

from __future__ import annotations

import ast
import subprocess
import sys
from collections.abc import Sequence
from importlib.util import find_spec
from pathlib import Path

from .output import publish_dir

QUICK: dict[str, list[str]] = {
    "amp_training": ["--steps", "3"],
    "attention_scaling": ["--quick", "--no-memory", "--threads", "1"],
    "compile": ["--models", "laplacianformer_micro", "--size", "32", "--backend", "aot_eager", "--repeats", "1",
                "--op-side", "8", "--op-repeats", "1"],
    "cpu_inference": ["--model", "laplacianformer_micro", "--sizes", "32", "--repeats", "1", "--threads", "1"],
    "detection_scaling": ["--model", "laplacianformer_micro", "--sizes", "64", "--fpn-channels", "16", "--repeats", "1",
                          "--memory", "heap", "--threads", "1", "--no-progress"],
    "gpu_overhead": ["--device", "cpu", "--model", "laplacianformer_micro", "--size", "32", "--batch", "1",
                     "--repeats", "1", "--no-compile"],
    "host_overhead": ["--model", "laplacianformer_micro", "--side", "8", "--repeats", "2", "--max-seconds", "1"],
    "kernels": ["--quick", "--devices", "cpu"],
    "model_cost": ["--sizes", "32", "64", "--repeats", "1", "--max-seconds", "2", "--cap-s", "10"],
    "model_throughput": ["--model", "laplacianformer_micro", "--sizes", "32", "--repeats", "1", "--no-memory"],
    "normalization": ["--sizes", "256", "--repeats", "1"],
    "onnx_deploy": ["--model", "laplacianformer_micro", "--sizes", "64", "--repeats", "1", "--no-memory"],
    "padding": ["--max-len", "32", "--batch", "2", "--dim", "16", "--repeats", "1"],
    "startup": ["--repeats", "1"],
    "stage_attention": ["--model", "laplacianformer_micro", "--size", "64", "--repeats", "1"],
}
"""Every benchmark, with the arguments of its ``--quick`` run (seconds; smoke-test numbers, not results). The
repository's one-off investigations and GPU-only study scripts (``benchmarks/``: gpu_targets, roofline,
launch_census, cpu_pitfalls, gpu_micro, ...) are not in the package and not listed here."""

BENCHMARKS = tuple(sorted(QUICK))


def module_of(name: str) -> str:
    return f"{__package__}.{name}"


def describe(name: str) -> str:
    """The first paragraph of the benchmark's docstring on one line, read from its source without importing it."""
    path = Path(find_spec(module_of(name)).origin)
    doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
    return " ".join(doc.split("\n\n")[0].split())


def check_names(names: Sequence[str]) -> list[str]:
    """``names`` (all benchmarks when empty); ValueError naming the first unknown one."""
    unknown = [n for n in names if n not in QUICK]
    if unknown:
        raise ValueError(f"bench: unknown benchmark {unknown[0]!r}; available: {', '.join(BENCHMARKS)}")
    return list(names or BENCHMARKS)


def command(name: str, *, quick: bool = False, publish: str | Path | None = None,
            options: Sequence[str] = ()) -> list[str]:
    """The command line of one benchmark run (``publish``: a directory, resolved to an absolute path;
    ``options``: the benchmark's own, after the ``--quick`` ones, so they override them)."""
    cmd = [sys.executable, "-m", module_of(name), *(QUICK[name] if quick else []), *options]
    if publish is not None:
        cmd += ["--publish", str(publish_dir(publish).resolve())]
    return cmd


def run(names: Sequence[str], *, quick: bool = False, publish: str | Path | None = None,
        options: Sequence[str] = ()) -> int:
    """Runs the benchmarks one after another in the current directory; the first non-zero exit status (0: all
    passed). ``publish`` replaces the published files, so it is refused with ``quick`` (smoke-test numbers).
    ``options``: the one named benchmark's own command-line options."""
    from .process import package_env

    if quick and publish is not None:
        raise ValueError("--publish: refused with --quick (it would replace published results with smoke-test numbers)")
    if options and len(names) != 1:
        raise ValueError(f"bench: the benchmark options {' '.join(options)!r} need exactly one benchmark name, got "
                         f"{len(names)}")
    cmds = [command(n, quick=quick, publish=publish, options=options) for n in check_names(names)]
    rc = 0
    for cmd in cmds:
        print(f"$ python {' '.join(cmd[1:])}", flush=True)
        rc = rc or subprocess.call(cmd, env=package_env())
    return rc
