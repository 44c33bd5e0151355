"""Images/s (training and inference) and peak memory of one backbone with three attentions, side by side.

    python -m laplacianformer.bench.model_throughput                       # Tiny at 224² and 512², CPU
    python -m laplacianformer.bench.model_throughput --device cuda --batch 8
    python -m laplacianformer.bench.model_throughput --retain-heap         # glibc keeps freed memory (steady state)

Same LaplacianFormer backbone (default Tiny), attention "laplacian" | "laplacian-recompute" (the same with
``recompute=True``: the lean recompute of docs/DESIGN.md §5.5, the q/k projections and the two N×m kernel
matrices recomputed in the backward) | "laplacian-checkpoint" (``recompute=True`` forced to activation
checkpointing of the whole core, ``ops.use(recompute="checkpoint")``: the earlier implementation) | "gaussian"
(same module, Gaussian kernel) | "softmax" (PVTv2 spatial-reduction softmax, the quadratic baseline).
Inference: forward under no_grad in eval mode (the recompute variants are training-only rows). Training:
forward + cross-entropy + backward (no optimizer step) in train mode.
Timing: the variants of one (size, mode) run round-robin, one call each per round, so machine load hits
them alike; medians and IQRs over the rounds (wall time, and process CPU time).
Memory: "peak RSS" is one call in a fresh subprocess (CPU: RSS high-water mark) or the CUDA allocator peak;
"peak heap" (CPU) the live C-heap peak of one call sampled after every op (``bench/harness.py``);
"activations" (training) what autograd keeps for the backward, counted from the saved tensors' storages.
Ratios: each variant against softmax, and each recompute / Newton–Schulz-iterations variant against
"laplacian" (defaults), per (size, mode), from the same run (side by side).
``--autocast bf16`` (or fp16) runs every call under ``torch.autocast`` (rows marked "bf16-autocast"; the
attention operator itself computes in float32 there, docs/DESIGN.md §1); the file stem gets ``_bf16``.
    python -m laplacianformer.bench.model_throughput --model laplacianformer_micro --sizes 28 --batch 128 \
        --model-kwargs '{"stem_stride": 2, "in_chans": 1, "num_classes": 10}' \
        --attn laplacian laplacian-ns10 laplacian-ns30 laplacian-ns40 softmax   # the ns_iters ablation's cost
``--retain-heap`` reruns the script with glibc tunables that keep freed memory mapped (``bench/harness.py``):
with the default allocator part of each time is page faults on fresh memory, which moves with the order of
all allocations; with it, times are steady-state compute. Writes
runs/bench/model_throughput/model_throughput_<device>[_retain].{json,md,png}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse

from .harness import peak_heap_mib, peak_memory, round_robin
from .options import add_autocast_option, add_model_options, add_round_options, add_timing_options, autocast_context, \
    precision_name, start_timing_run, write_results
from .report import markdown_table, plot_loglog, report_header, write_text
from ..cmdline import json_object
from .model_cost import build_net, make_call, training_activation_mib

VARIANTS = {
    "laplacian": dict(attn="laplacian"),
    "laplacian-recompute": dict(attn="laplacian", attn_kwargs=dict(recompute=True)),
    "laplacian-checkpoint": dict(attn="laplacian", attn_kwargs=dict(recompute=True),
                                 runtime=dict(recompute="checkpoint")),
    "gaussian": dict(attn="gaussian"),
    "softmax": dict(attn="softmax"),
}
"""Benchmark rows: the three attentions of the backbone and the Laplacian one with ``recompute=True``, lean
(the default) or forced to checkpointing (``runtime``: the ``ops.use`` choices the calls run under). The
recompute variants are identical to "laplacian" in inference and are measured in training only. Opt-in rows
``laplacian-nsN``: the Laplacian one with N Newton–Schulz iterations instead of the default 20 (the time side
of the ``ns_iters`` ablation, whose counts the caller passes)."""

NS_ITERS_PREFIX = "laplacian-ns"
DEFAULT_VARIANTS = tuple(VARIANTS)
TRAIN_ONLY = ("laplacian-recompute", "laplacian-checkpoint")
LAPLACIAN_BASE = "laplacian"


def _ns_iters(attn: str) -> int | None:
    """N of a ``laplacian-nsN`` row, else None."""
    count = attn[len(NS_ITERS_PREFIX):] if attn.startswith(NS_ITERS_PREFIX) else ""
    return int(count) if count.isdigit() and int(count) > 0 else None


def variant(attn: str) -> str:
    """An argparse type: a key of ``VARIANTS`` or ``laplacian-nsN`` (N >= 1)."""
    if attn not in VARIANTS and _ns_iters(attn) is None:
        raise argparse.ArgumentTypeError(f"expected one of {', '.join(VARIANTS)} or {NS_ITERS_PREFIX}N, got {attn!r}")
    return attn


def _split(attn: str) -> tuple[dict, dict]:
    iters = _ns_iters(attn)
    spec = dict(VARIANTS[attn]) if iters is None else dict(attn="laplacian", attn_kwargs=dict(iters=iters))
    return spec, spec.pop("runtime", {})


def _under(runtime: dict, fn, autocast: str | None = None, device: str = "cpu"):
    """fn run inside ``ops.use(**runtime)`` and ``torch.autocast`` for ``autocast`` (fn itself when there is
    nothing to force)."""
    if not runtime and autocast is None:
        return fn
    from .. import ops

    def call():
        with ops.use(**runtime), autocast_context(device, autocast):
            return fn()

    return call


def make_case(model: str, attn: str, size: int, batch: int, mode: str, device: str = "cpu", seed: int = 0,
              model_kwargs: dict | None = None, autocast: str | None = None):
    """Factory: builds the model and inputs, returns the zero-argument callable to time (``mode`` infer|train).

    ``attn`` is a ``variant``; ``model_kwargs`` go to the model's constructor (e.g. ``stem_stride``);
    the calls are ``model_cost.make_call``'s, under ``torch.autocast`` when ``autocast`` ("bf16", "fp16")."""
    spec, runtime = _split(attn)
    net = build_net(model, **spec, model_kwargs=model_kwargs, device=device, seed=seed)
    return _under(runtime, make_call(net, size, mode, batch=batch, device=device, seed=seed), autocast, device)


def saved_activations_mb(model: str, attn: str, size: int, batch: int, device: str = "cpu",
                         model_kwargs: dict | None = None, autocast: str | None = None) -> float:
    """MiB of the distinct storages autograd keeps for the backward of one training forward (the
    activation memory, parameters excluded); deterministic, unlike an allocator or RSS peak."""
    spec, runtime = _split(attn)
    net = build_net(model, **spec, model_kwargs=model_kwargs, device=device)
    return _under(runtime, lambda: training_activation_mib(net, size, batch=batch, device=device), autocast, device)()


def run(args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    groups = [(s, m) for s in args.sizes for m in ("infer", "train")]
    for size, mode in tqdm(groups, desc="model_throughput"):
        names = [a for a in args.attn if not (mode == "infer" and a in TRAIN_ONLY)]
        kwargs = {a: dict(model=args.model, attn=a, size=size, batch=args.batch, mode=mode, device=args.device,
                          model_kwargs=args.model_kwargs, autocast=args.autocast) for a in names}
        fns = {a: make_case(**kwargs[a]) for a in names}
        timings = round_robin(fns, device=args.device, repeats=args.repeats, max_seconds=args.max_seconds)
        heap = {a: peak_heap_mib(fn) if args.device == "cpu" else None for a, fn in fns.items()}
        del fns
        for attn in names:
            mem = None
            if not args.no_memory:
                mem = peak_memory(
                    "laplacianformer.bench.model_throughput:make_case", kwargs[attn], device=args.device,
                    warmup_kwargs=dict(size=64, batch=1), threads=args.threads,
                )["peak_mb"]
            saved = (saved_activations_mb(args.model, attn, size, args.batch, args.device, args.model_kwargs,
                                          args.autocast) if mode == "train" else None)
            t = timings[attn]
            rows.append(dict(
                model=args.model, attn=attn, size=size, batch=args.batch, mode=mode,
                precision=precision_name(args.autocast), median_ms=t.median_ms,
                iqr_ms=t.iqr_ms, cpu_ms=t.cpu_ms, repeats=t.repeats, images_per_s=args.batch * 1e3 / t.median_ms,
                peak_mb=mem, heap_mb=heap[attn], activations_mb=saved,
            ))
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Each variant relative to softmax, per (size, mode): time, peak memory and activation ratios (<1: less)."""
    out = []
    key = {(r["size"], r["mode"], r["attn"]): r for r in rows}
    for (size, mode, attn), r in key.items():
        base = key.get((size, mode, "softmax"))
        if attn == "softmax" or base is None:
            continue
        div = lambda a, b: a / b if a and b else None
        out.append(dict(
            size=size, mode=mode, attn=attn, time_vs_softmax=r["median_ms"] / base["median_ms"],
            memory_vs_softmax=div(r["peak_mb"], base["peak_mb"]),
            heap_vs_softmax=div(r.get("heap_mb"), base.get("heap_mb")),
            activations_vs_softmax=div(r.get("activations_mb"), base.get("activations_mb")),
        ))
    return out


def ratios_to_laplacian(rows: list[dict], variants=TRAIN_ONLY) -> list[dict]:
    """Each of ``variants`` relative to "laplacian" (default options) per (size, mode): wall and CPU time, peak
    RSS, peak heap and activation ratios (<1: less), measured side by side in one run. With the default
    ``variants`` these are the recompute variants against no recompute."""
    out = []
    key = {(r["size"], r["mode"], r["attn"]): r for r in rows}
    div = lambda a, b: a / b if a and b else None
    for (size, mode, attn), r in key.items():
        base = key.get((size, mode, LAPLACIAN_BASE))
        if attn not in variants or base is None:
            continue
        out.append(dict(
            size=size, mode=mode, attn=attn, time_vs_none=r["median_ms"] / base["median_ms"],
            cpu_time_vs_none=div(r.get("cpu_ms"), base.get("cpu_ms")),
            memory_vs_none=div(r["peak_mb"], base["peak_mb"]),
            heap_vs_none=div(r.get("heap_mb"), base.get("heap_mb")),
            activations_vs_none=div(r.get("activations_mb"), base.get("activations_mb")),
        ))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_options(p, batch=1)
    p.add_argument("--model-kwargs", type=json_object('{"stem_stride": 2}'), default=None, metavar="JSON",
                   help='constructor options of the model, e.g. \'{"stem_stride": 2, "in_chans": 1, "num_classes": 10}\'')
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 512])
    p.add_argument("--attn", nargs="+", type=variant, default=list(DEFAULT_VARIANTS),
                   help=f"variants (default: {' '.join(DEFAULT_VARIANTS)}; opt-in: {NS_ITERS_PREFIX}N, N Newton–Schulz "
                        "iterations)")
    add_round_options(p, repeats=5, max_seconds=60.0, per="(size, mode) group")
    p.add_argument("--no-memory", action="store_true")
    add_autocast_option(p)
    add_timing_options(p)
    args = p.parse_args(argv)
    load_before = start_timing_run(args, "laplacianformer.bench.model_throughput", argv)
    rows = run(args)
    rel = ratios(rows)
    rec = ratios_to_laplacian(rows)
    ns = ratios_to_laplacian(rows, [a for a in args.attn if _ns_iters(a) is not None])
    stem, load = write_results(args, "model_throughput", load_before,
                               dict(rows=rows, ratios=rel, recompute_ratios=rec, ns_iters_ratios=ns),
                               variant=f"_{args.autocast}" if args.autocast else "")
    table = markdown_table(
        ["attn", "size", "mode", "batch", "median ms", "IQR ms", "CPU ms", "images/s", "peak RSS MiB", "peak heap MiB",
         "activations MiB"],
        [[r["attn"], r["size"], r["mode"], r["batch"], r["median_ms"], r["iqr_ms"], r["cpu_ms"], r["images_per_s"],
          r["peak_mb"], r["heap_mb"], r["activations_mb"]] for r in rows],
    )
    if rel:
        table += "\n" + markdown_table(
            ["attn", "size", "mode", "time / softmax", "peak RSS / softmax", "peak heap / softmax",
             "activations / softmax"],
            [[r["attn"], r["size"], r["mode"], r["time_vs_softmax"], r["memory_vs_softmax"], r["heap_vs_softmax"],
              r["activations_vs_softmax"]] for r in rel],
        )
    if rec:
        table += "\n" + markdown_table(
            ["recompute", "size", "mode", "wall time / none", "CPU time / none", "peak RSS / none",
             "peak heap / none", "activations / none"],
            [[r["attn"], r["size"], r["mode"], r["time_vs_none"], r["cpu_time_vs_none"], r["memory_vs_none"],
              r["heap_vs_none"], r["activations_vs_none"]] for r in rec],
        )
    if ns:
        table += "\n" + markdown_table(
            ["Newton–Schulz iterations (default 20)", "size", "mode", "wall time / default", "CPU time / default"],
            [[r["attn"], r["size"], r["mode"], r["time_vs_none"], r["cpu_time_vs_none"]] for r in ns],
        )
    header = report_header(f"{args.model} throughput", args, load, precision_name(args.autocast))
    write_text(stem.with_suffix(".md"), header + table)
    print(header + table)
    panels = []
    for mode in ("infer", "train"):
        series = {a: ([r["size"] for r in rows if r["attn"] == a and r["mode"] == mode],
                      [r["images_per_s"] for r in rows if r["attn"] == a and r["mode"] == mode]) for a in args.attn}
        series = {a: xy for a, xy in series.items() if xy[0]}
        panels.append(dict(ylabel="images / s", title=mode, series=series))
    if not args.no_memory:
        series = {f"{a} {m}": ([r["size"] for r in rows if r["attn"] == a and r["mode"] == m],
                               [r["peak_mb"] for r in rows if r["attn"] == a and r["mode"] == m])
                  for a in args.attn for m in ("infer", "train")}
        series = {a: xy for a, xy in series.items() if xy[0]}
        panels.append(dict(ylabel="peak RSS MiB", title="peak memory", series=series))
    if args.device == "cpu":
        series = {f"{a} {m}": ([r["size"] for r in rows if r["attn"] == a and r["mode"] == m and r["heap_mb"]],
                               [r["heap_mb"] for r in rows if r["attn"] == a and r["mode"] == m and r["heap_mb"]])
                  for a in args.attn for m in ("infer", "train")}
        series = {a: xy for a, xy in series.items() if xy[0]}
        panels.append(dict(ylabel="peak heap MiB", title="live memory peak", series=series))
    series = {a: ([r["size"] for r in rows if r["attn"] == a and r["mode"] == "train"],
                  [r["activations_mb"] for r in rows if r["attn"] == a and r["mode"] == "train"]) for a in args.attn}
    series = {a: xy for a, xy in series.items() if xy[0]}
    panels.append(dict(ylabel="MiB kept for backward", title="training activations", series=series))
    plot_loglog(stem.with_suffix(".png"), panels, xlabel="image side (px)", title=f"{args.model}, batch {args.batch}")


if __name__ == "__main__":
    main()
