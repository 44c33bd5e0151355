"""ONNX Runtime against eager mode on the CPU: time, peak memory and error of one forward per input size.

    python -m laplacianformer.bench.onnx_deploy                      # Tiny, batch 1, 2 threads, 512² and 1024²
    python -m laplacianformer.bench.onnx_deploy --compare-broadcast --publish   # + the export before issue 42

The model (random weights, ``torch.manual_seed(--seed)``) is exported once by ``export_onnx`` (TorchScript
exporter, dynamic batch, H and W, opset 18) at --export-size; every size then runs the same file. Per size:

- error: max |ort − eager| / max |eager| of the logits (``export_check.relative_error``), one call each;
- time: eager (``torch.no_grad``) and onnxruntime (CPU provider, ``intra_op_num_threads`` = --threads,
  sequential execution) called round-robin in one process, one warm-up call each, medians;
- memory: peak RSS increment of one forward, each in a fresh process (``harness.peak_memory``) after a
  warm-up forward at --warmup-size in that process (library loads, onnxruntime's session and kernel set-up
  are not counted; onnxruntime's memory arena is, as a user's first large input sees it).

--compare-broadcast adds a second export with ``composite.EXPORT_CHUNK = 0``: the distance recorded as
torch.cdist, whose translation broadcasts an (N, m, d) tensor (the form before issue 42). --ort-options
picks onnxruntime's session settings (``SESSION_OPTIONS``). Targets of issue 42, printed and not asserted:
onnxruntime / eager ≤ 1.2× in time, ≤ 1.5× in peak memory at the largest size, relative error ≤ 1e-4.
Writes runs/bench/onnx_deploy/onnx_deploy_cpu_threads<N>.{json,md,png} (``--publish``: benchmarks/results/).
"""

from __future__ import annotations

import argparse
import os
import tempfile
from pathlib import Path

import torch

from .harness import inference_call, peak_memory, round_robin
from .options import add_model_options, add_round_options, add_timing_options, start_timing_run, write_results
from .report import bar_labels, figure, markdown_table, report_header, save_figure, write_text

TARGETS = dict(time=1.2, memory=1.5, error=1e-4)
"""Issue 42's targets: onnxruntime / eager time at every size, peak-memory ratio at the largest size, error."""

SESSION_OPTIONS = {
    "default": {},
    "no-arena": dict(enable_cpu_mem_arena=False),
}
"""onnxruntime ``SessionOptions`` attributes beyond the thread counts, by --ort-options name."""

MODULE = "laplacianformer.bench.onnx_deploy"
"""This module's import name (the memory processes import its factories; ``__name__`` is __main__ under -m)."""

_CACHE: dict = {}


def build_model(model: str, seed: int) -> torch.nn.Module:
    """The benchmarked model in eval mode: random weights from ``torch.manual_seed(seed)`` (same in every process)."""
    from ..models import create_model

    torch.manual_seed(seed)
    return create_model(model).eval()


def _image(batch: int, size: int):
    return torch.randn(batch, 3, size, size, generator=torch.Generator().manual_seed(size))


def session(path: str, threads: int, options: str = "default"):
    """An onnxruntime CPU session of ``path`` (cached per process): ``threads`` intra-op threads, sequential."""
    key = ("ort", path, threads, options)
    if key not in _CACHE:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.intra_op_num_threads, so.inter_op_num_threads = threads, 1
        so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
        for name, value in SESSION_OPTIONS[options].items():
            setattr(so, name, value)
        _CACHE[key] = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    return _CACHE[key]


def eager_case(model: str, seed: int, size: int, batch: int = 1, **_):
    """One eager forward (no_grad) of ``build_model`` at (batch, 3, size, size); the model is cached per process."""
    key = ("eager", model, seed)
    if key not in _CACHE:
        _CACHE[key] = build_model(model, seed)
    return inference_call(_CACHE[key], _image(batch, size))


def ort_case(path: str, size: int, batch: int = 1, threads: int = 2, options: str = "default", **_):
    """One onnxruntime forward of the file ``path`` at (batch, 3, size, size)."""
    sess = session(path, threads, options)
    name, x = sess.get_inputs()[0].name, _image(batch, size).numpy()
    return lambda: sess.run(None, {name: x})


def export(model: torch.nn.Module, path: Path, size: int, chunk: int | None) -> Path:
    """``export_onnx`` of ``model`` at a (1, 3, size, size) example; ``chunk``: ``composite.EXPORT_CHUNK`` for
    this export (0: torch.cdist's broadcast), None: the package's."""
    from ..models.export import export_onnx
    from ..ops.kernel import composite

    saved = composite.EXPORT_CHUNK
    composite.EXPORT_CHUNK = saved if chunk is None else chunk
    try:
        export_onnx(model, path, torch.randn(1, 3, size, size))
    finally:
        composite.EXPORT_CHUNK = saved
    return path


def run(args, files: dict[str, Path]) -> list[dict]:
    """One row per size: times, peak memory and errors of eager mode and each exported file."""
    from ..models.export_check import relative_error

    model = build_model(args.model, args.seed)
    rows = []
    for size in args.sizes:
        x = _image(args.batch, size)
        fns = {"eager": inference_call(model, x)}
        ref = fns["eager"]().numpy()
        row = dict(size=size, batch=args.batch, errors={}, time_ms={}, time_iqr_ms={}, peak_mib={})
        for label, path in files.items():
            fns[label] = ort_case(str(path), size, args.batch, args.threads, args.ort_options)
            row["errors"][label] = relative_error(fns[label]()[0], ref)[1]
        timings = round_robin(fns, repeats=args.repeats, max_seconds=args.max_seconds)
        for label, t in timings.items():
            row["time_ms"][label], row["time_iqr_ms"][label] = t.median_ms, t.iqr_ms
        row["repeats"] = min(t.repeats for t in timings.values())
        if args.memory:
            common = dict(size=size, batch=args.batch)
            row["peak_mib"]["eager"] = peak_memory(
                f"{MODULE}:eager_case", dict(common, model=args.model, seed=args.seed),
                warmup_kwargs=dict(size=args.warmup_size), threads=args.threads)["peak_mb"]
            for label, path in files.items():
                row["peak_mib"][label] = peak_memory(
                    f"{MODULE}:ort_case", dict(common, path=str(path), threads=args.threads, options=args.ort_options),
                    warmup_kwargs=dict(size=args.warmup_size), threads=args.threads)["peak_mb"]
        rows.append(row)
        print(row, flush=True)
    return rows


def table(rows: list[dict], labels: list[str]) -> str:
    """The Markdown table: one line per size and runtime, ratios to eager mode beside each."""
    out = []
    for r in rows:
        e_ms, e_mib = r["time_ms"]["eager"], r["peak_mib"].get("eager")
        out.append([f"{r['size']}²", "eager (PyTorch)", e_ms, "1", e_mib, "1" if e_mib else None, "–"])
        for label in labels:
            ms, mib = r["time_ms"][label], r["peak_mib"].get(label)
            out.append([f"{r['size']}²", label, ms, f"{ms / e_ms:.2f}", mib,
                        f"{mib / e_mib:.2f}" if mib and e_mib else None, f"{r['errors'][label]:.1e}"])
    return markdown_table(["size", "runtime", "ms (median)", "× eager", "peak RSS MiB", "× eager",
                           "relative error"], out)


def plot(path, rows: list[dict], labels: list[str], title: str) -> None:
    names = ["eager", *labels]
    fig, axes = figure(1, 2, size=(10, 3.8))
    width = 0.8 / len(names)
    for ax, key, ylabel in ((axes[0], "time_ms", "ms per forward (median)"),
                            (axes[1], "peak_mib", "peak RSS increment, MiB")):
        for i, name in enumerate(names):
            ys = [r[key].get(name, 0.0) or 0.0 for r in rows]
            ax.bar([j + (i - (len(names) - 1) / 2) * width for j in range(len(rows))], ys, width, label=name)
        bar_labels(ax, [f"{r['size']}²" for r in rows], ylabel)
        ax.legend(fontsize=8)
    save_figure(fig, path, title)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_options(p, batch=1)
    p.add_argument("--sizes", type=int, nargs="+", default=[512, 1024], help="square input sides (default 512 1024)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--export-size", type=int, default=224, help="side of the export's example input (default 224)")
    p.add_argument("--warmup-size", type=int, default=64, help="side of the memory runs' warm-up forward (default 64)")
    add_round_options(p, repeats=5, max_seconds=240.0, per="size")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory processes")
    p.add_argument("--ort-options", choices=sorted(SESSION_OPTIONS), default="default")
    p.add_argument("--compare-broadcast", action="store_true",
                   help="also time a file exported with the distance as torch.cdist's broadcast (before issue 42)")
    p.add_argument("--onnx", default=None, help="use this exported file instead of exporting (its model and seed must match)")
    add_timing_options(p, threads=2)
    args = p.parse_args(argv)
    load_before = start_timing_run(args, MODULE, argv)
    with tempfile.TemporaryDirectory(prefix="onnx_deploy_") as tmp:
        model = build_model(args.model, args.seed)
        files = {"onnxruntime": Path(args.onnx) if args.onnx else export(model, Path(tmp, "model.onnx"),
                                                                            args.export_size, None)}
        if args.compare_broadcast:
            files["onnxruntime, broadcast export"] = export(model, Path(tmp, "broadcast.onnx"), args.export_size, 0)
        del model
        rows = run(args, files)
    labels = list(files)
    stem, load = write_results(args, "onnx_deploy", load_before, dict(rows=rows, targets=TARGETS),
                               variant=f"_threads{args.threads}")
    text = table(rows, labels)
    header = report_header(f"{args.model}: eager mode and onnxruntime, inference", args, load,
                           f"batch {args.batch}; {args.threads} threads; onnxruntime options {args.ort_options}")
    write_text(stem.with_suffix(".md"), header + text)
    print(header + text)
    plot(stem.with_suffix(".png"), rows, labels,
         f"{args.model}, batch {args.batch}, {args.threads} threads (load {load['before'][0]:.1f} / {load['after'][0]:.1f})")


if __name__ == "__main__":
    main()
