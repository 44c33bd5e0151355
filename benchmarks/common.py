"""Shared benchmark utilities: machine info, a timer, peak memory, and JSON / Markdown / PNG writers.

Import from the repository root (``python -m benchmarks.<script>``) or put the root on ``sys.path``:

    from benchmarks.common import machine_info, time_call, peak_memory, write_json, markdown_table, plot_loglog

Peak memory (``peak_memory``):
- CUDA: ``torch.cuda.max_memory_allocated`` during the call minus ``torch.cuda.memory_allocated`` before
  it (inputs excluded), after ``torch.cuda.reset_peak_memory_stats``.
- CPU: the case runs in a fresh Python subprocess. The child imports the factory's module, optionally
  runs a small warm-up case (``warmup_kwargs``) so one-time initialisation is not counted, builds the
  callable and its inputs, records its resident set size (RSS, from /proc/self/statm), resets the kernel's
  high-water mark (writing 5 to /proc/self/clear_refs, so transient import peaks do not count), runs the
  call once and reads the new high-water mark (VmHWM). Where the reset is not allowed it reads
  ``resource.getrusage(RUSAGE_SELF).ru_maxrss`` instead, which can include an earlier import peak and is
  then an upper bound. Reported: peak RSS minus the RSS after imports and input creation, in MiB. The
  allocator may keep freed pages mapped, so this counts memory the process touched, not live tensors.
``peak_heap_memory`` (CPU, glibc) counts live allocations instead: the C heap in use, sampled after every
aten op during one call, minus the level before it (``laplacianformer.train.cost.peak_heap_mib``).

Allocator (CPU): by default glibc returns freed large blocks to the kernel (``munmap``, heap trimming), so
a later tensor of that size starts on fresh pages and pays one page fault per 4 KiB on first touch
(``python -m benchmarks.cpu_pitfalls`` measures the cost per page). Which tensors pay depends on the order of
every allocation in the process, so the same model's time moves between runs and between neighbouring
variants. ``RETAINED_HEAP_ENV`` (the ``--retain-heap`` option of the timing scripts) sets
glibc's tunables so that freed memory stays mapped and is reused: times are then steady-state compute.
Both are worth reporting; ``allocator`` in the JSON settings says which one a file holds.
"""

from __future__ import annotations

import datetime
import importlib
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
MIB = 2**20


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def machine_info() -> dict:
    """What a result depends on: CPU, cores, torch threads, library versions and the GPU if any."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    info = {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
    return info


def synchronize(device: str | torch.device) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


@dataclass
class Timing:
    """Wall-clock statistics in milliseconds over ``repeats`` timed calls (after warm-up)."""

    median_ms: float
    q1_ms: float
    q3_ms: float
    iqr_ms: float
    min_ms: float
    repeats: int
    warmup_ms: list

    def as_dict(self) -> dict:
        return asdict(self)


def _quartiles(xs: Sequence[float]) -> tuple[float, float, float]:
    if len(xs) == 1:
        return xs[0], xs[0], xs[0]
    q1, med, q3 = statistics.quantiles(xs, n=4, method="inclusive")
    return q1, med, q3


def time_call(
    fn: Callable[[], object],
    *,
    device: str | torch.device = "cpu",
    warmup: int = 1,
    repeats: int = 5,
    max_seconds: float | None = None,
) -> Timing:
    """Times ``fn()``: ``warmup`` untimed-for-statistics calls, then ``repeats`` timed calls.

    Each call is bracketed by ``torch.cuda.synchronize`` on CUDA. When ``max_seconds`` is given and a
    warm-up call alone took longer, fewer repeats are run (at least one) so a slow case stays bounded;
    ``repeats`` in the result says how many were timed. The warm-up durations are kept in ``warmup_ms``.
    """
    warm = []
    for _ in range(warmup):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        warm.append((time.perf_counter() - t0) * 1e3)
    if max_seconds is not None and warm:
        per_call = max(warm[-1] / 1e3, 1e-9)
        repeats = max(1, min(repeats, int(max_seconds / per_call)))
    times = []
    for _ in range(repeats):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append((time.perf_counter() - t0) * 1e3)
    q1, med, q3 = _quartiles(times)
    return Timing(med, q1, q3, q3 - q1, min(times), len(times), warm)


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


def _peak_rss_bytes(reset_ok: bool) -> int:
    if reset_ok:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def resolve_factory(spec: str) -> Callable[..., Callable[[], object]]:
    """'package.module:function' -> the function (a factory returning a zero-argument callable)."""
    module, _, name = spec.partition(":")
    if not name:
        raise ValueError(f"factory: expected 'module:function', got {spec!r}")
    return getattr(importlib.import_module(module), name)


def _peak_memory_child(spec: str, kwargs: dict, warmup_kwargs: dict | None, threads: int | None) -> dict:
    if threads is not None:
        torch.set_num_threads(threads)
    factory = resolve_factory(spec)
    if warmup_kwargs is not None:
        factory(**{**kwargs, **warmup_kwargs})()
    fn = factory(**kwargs)
    before = _rss_bytes()
    reset_ok = _reset_peak_rss()
    fn()
    peak = _peak_rss_bytes(reset_ok)
    method = "VmHWM after clear_refs reset" if reset_ok else "ru_maxrss"
    return {"peak_mb": max(peak - before, 0) / MIB, "baseline_mb": before / MIB, "method": method}


def peak_memory(
    factory: str,
    kwargs: Mapping | None = None,
    *,
    device: str | torch.device = "cpu",
    timeout: float | None = None,
    warmup_kwargs: Mapping | None = None,
    threads: int | None = None,
) -> dict:
    """Peak memory of one call of ``factory(**kwargs)()`` beyond its inputs, in MiB (see module docstring).

    ``factory`` is 'module:function'; the function builds the inputs and returns the callable to
    measure. ``kwargs`` must be JSON-serialisable (it crosses a process boundary on CPU).
    ``warmup_kwargs``: when given, ``factory(**kwargs, **warmup_kwargs)()`` runs first (e.g. a tiny size)
    so one-time initialisation (thread pools, lazily built kernels) is not counted.
    ``threads``: torch.set_num_threads in the CPU subprocess (default: torch's default).
    Returns {"peak_mb", "baseline_mb", "method"}.
    """
    kwargs = dict(kwargs or {})
    warmup_kwargs = None if warmup_kwargs is None else dict(warmup_kwargs)
    if torch.device(device).type == "cuda":
        factory_fn = resolve_factory(factory)
        if warmup_kwargs is not None:
            factory_fn(**{**kwargs, **warmup_kwargs})()
        fn = factory_fn(**kwargs)
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        fn()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated()
        return {"peak_mb": (peak - before) / MIB, "baseline_mb": before / MIB, "method": "cuda max_memory_allocated"}
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    child_args = {"kwargs": kwargs, "warmup_kwargs": warmup_kwargs, "threads": threads}
    cmd = [sys.executable, "-m", "benchmarks.common", "--peak-memory-child", factory, json.dumps(child_args)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(REPO_ROOT))
    if proc.returncode != 0:
        raise RuntimeError(f"peak-memory subprocess failed ({factory} {kwargs}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# The C-heap measurement lives in the package (the demo's cost panel uses it too): one copy.
from laplacianformer.train.cost import heap_in_use  # noqa: E402,F401
from laplacianformer.train.cost import peak_heap_mib as peak_heap_memory  # noqa: E402,F401


RETAINED_HEAP_ENV = {
    "MALLOC_MMAP_THRESHOLD_": str(2**31 - 1),  # large blocks from the heap, not per-call mmap/munmap
    "MALLOC_TRIM_THRESHOLD_": str(2**31 - 1),  # never give the top of the heap back
    "MALLOC_TOP_PAD_": str(256 * MIB),  # grow the heap in large steps
}
"""glibc tunables (read at process start) that keep freed memory mapped for reuse."""


def allocator_setting() -> str:
    """'glibc-retain' when ``RETAINED_HEAP_ENV`` is in effect for this process, else 'default'."""
    return "glibc-retain" if all(os.environ.get(k) == v for k, v in RETAINED_HEAP_ENV.items()) else "default"


def reexec_with_retained_heap(module: str, argv: Sequence[str] | None = None) -> None:
    """Restarts this process as ``python -m module *argv`` (default: this process's arguments) with
    ``RETAINED_HEAP_ENV`` set, unless it is set already (glibc reads it only at start-up). Returns only in
    the already-set case."""
    if allocator_setting() == "glibc-retain":
        return
    env = {**os.environ, **RETAINED_HEAP_ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO_ROOT), env.get("PYTHONPATH", "")]))
    args = list(sys.argv[1:] if argv is None else argv)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *args], env)


def add_timing_options(parser, name: str) -> None:
    """The options every timing script shares: --device, --threads, --retain-heap, --out (``name`` is the
    script's results stem, e.g. 'model_throughput')."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--retain-heap", action="store_true",
                        help="rerun with glibc keeping freed memory mapped (steady-state times, no page-fault lottery)")
    parser.add_argument("--out", default=None, help=f"output stem (default results/{name}_<device>[_retain])")


def start_timing_run(args, module: str, argv: Sequence[str] | None) -> tuple[float, float, float]:
    """Applies the shared options before timing: reruns ``python -m module`` under ``RETAINED_HEAP_ENV`` for
    --retain-heap, records ``args.allocator``, sets the thread count. Returns the load average before."""
    if args.retain_heap:
        reexec_with_retained_heap(module, argv)
    args.allocator = allocator_setting()
    if args.threads:
        torch.set_num_threads(args.threads)
    return os.getloadavg()


def results_stem(args, name: str) -> Path:
    """--out, or benchmarks/results/<name>_<device type>[_retain] (``_retain`` under ``RETAINED_HEAP_ENV``)."""
    if args.out:
        return Path(args.out)
    suffix = "_retain" if args.allocator == "glibc-retain" else ""
    return REPO_ROOT / "benchmarks" / "results" / f"{name}_{torch.device(args.device).type}{suffix}"


def report_header(title: str, args, load: Mapping, extra: str = "") -> str:
    """'# title (device; CPU; torch; allocator[; extra])' and the load-average line of a Markdown report;
    ``load`` is {"before": loadavg, "after": loadavg, "cpus": n}."""
    info = machine_info()
    extra = f"; {extra}" if extra else ""
    return (
        f"# {title} ({args.device}; {info.get('cpu', '')}; torch {torch.__version__}; allocator {args.allocator}{extra})"
        f"\n\nLoad average (1 min) before/after: {load['before'][0]:.1f} / {load['after'][0]:.1f} on {load['cpus']} CPUs.\n\n"
    )


def write_json(path: str | Path, results: object, *, settings: Mapping | None = None) -> Path:
    """Writes {"machine", "command", "settings", "timestamp_utc", "results"} as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": machine_info(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": dict(settings or {}),
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table; cells are str()-ed, floats printed with up to 4 significant digits."""

    def cell(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.4g}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def plot_loglog(
    path: str | Path,
    panels: Sequence[Mapping],
    *,
    xlabel: str,
    title: str | None = None,
) -> Path:
    """Side-by-side log-log panels.  panels: [{"ylabel": str, "series": {label: (xs, ys)}}, ...].

    Series with fewer than one positive point are left out; a label keeps its colour across panels.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.5), squeeze=False)
    labels = sorted({label for panel in panels for label in panel["series"]}, key=str)
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys) in panel["series"].items():
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
            if pts:
                ax.loglog(*zip(*pts), marker="o", label=label, color=colours[label])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel["ylabel"])
        if panel.get("title"):
            ax.set_title(panel["title"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x (the scaling exponent); None with fewer than two points."""
    import math

    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else None


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--peak-memory-child":
        child = json.loads(sys.argv[3])
        print(json.dumps(_peak_memory_child(sys.argv[2], child["kwargs"], child["warmup_kwargs"], child["threads"])))
    else:
        print(json.dumps(machine_info(), indent=2))
