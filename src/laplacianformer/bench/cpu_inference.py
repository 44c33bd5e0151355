"""CPU inference of one backbone, Laplacian against its SR-softmax twin: ms per image at each input size, eager
mode and optionally torch.compile and bf16 autocast, with the deployment targets beside the ratios.

    laplacianformer bench cpu_inference                          # Tiny, batch 1, 2 threads, 224² 512² 1024², eager
    laplacianformer bench cpu_inference --runtimes eager compile bf16 --publish

The two models (``create_model(model, attn="laplacian")`` and ``attn="softmax"``, seeded, eval, random weights)
of one (size, runtime) are timed round-robin in one process, one forward under ``torch.no_grad`` each per
round, so machine load hits them alike; medians and IQRs over the rounds. Runtimes: ``eager``; ``compile``
(``torch.compile`` with the default inductor backend, compiled and warmed before the timing, its compile time
reported); ``bf16`` (eager under ``torch.autocast("cpu", torch.bfloat16)``: the attention operator computes in
float32 there, docs/DESIGN.md §1). The issue's targets (issue 42: Laplacian / SR-softmax ≤ 1.15 at 224², ≤ 1.0
at 512², ≤ 0.85 at 1024², eager, 2 threads, batch 1) are printed beside the eager ratios; nothing asserts them.
Each size also reports both models' multiply-adds (``models.count_macs``, one image) and their ratio, so a time
ratio reads against the arithmetic: a target below the MAC ratio asks the Laplacian's kernels to outrun the
SR-softmax's GEMMs. The vector-op ratio (``models.count_vector_ops``) counts each L1-distance term as the
``VECTOR_OPS_PER_L1_TRIPLE`` vector operations the C loop spends on it, every other MAC as one FMA: the ratio to
expect if both models ran their vector units equally well. The eager rows also carry each model's peak RSS
increment of one forward, measured in a fresh process per (model, size) after a 64² warm-up there
(``harness.peak_memory`` of ``model_throughput.make_case``; ``--no-memory`` skips it).
Writes runs/bench/cpu_inference/cpu_inference_<device>.{json,md,png} (``--publish``: benchmarks/results/).
"""

from __future__ import annotations

import argparse
import contextlib
import time

import torch

from ..models import count_vector_ops
from .harness import peak_memory, round_robin
from .model_cost import build_net
from .options import add_model_options, add_round_options, add_timing_options, run_rows
from .report import figure, markdown_table, report_header, save_figure, write_text

ATTNS = ("laplacian", "softmax")
RUNTIMES = ("eager", "compile", "bf16")
TARGETS = {224: 1.15, 512: 1.0, 1024: 0.85}
"""Issue 42's targets of Laplacian / SR-softmax per input side (eager, 2 threads, batch 1)."""


def _forward(net: torch.nn.Module, x: torch.Tensor, runtime: str):
    """The zero-argument forward of one runtime (the compiled module is built here, compiled at its first call)."""
    model = torch.compile(net) if runtime == "compile" else net
    context = (lambda: torch.autocast("cpu", dtype=torch.bfloat16)) if runtime == "bf16" else contextlib.nullcontext

    def run():
        with torch.no_grad(), context():
            return model(x)

    return run


def run(args) -> list[dict]:
    rows = []
    nets = {a: build_net(args.model, a).eval() for a in ATTNS}
    for size in args.sizes:
        x = torch.randn(args.batch, 3, size, size, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            work = {a: count_vector_ops(nets[a], x[:1]) for a in ATTNS}  # (MACs, vector ops)
        macs = {a: w[0] for a, w in work.items()}
        for runtime in args.runtimes:
            fns = {a: _forward(nets[a], x, runtime) for a in ATTNS}
            first_ms = {}
            for a, fn in fns.items():  # the first call (compilation for "compile"), untimed by round_robin
                start = time.perf_counter()
                fn()
                first_ms[a] = (time.perf_counter() - start) * 1e3
            timings = round_robin(fns, device=args.device, repeats=args.repeats, max_seconds=args.max_seconds)
            lap, soft = timings["laplacian"], timings["softmax"]
            peaks = {a: None for a in ATTNS}
            if args.memory and runtime == "eager":
                peaks = {a: peak_memory("laplacianformer.bench.model_throughput:make_case",
                                        dict(model=args.model, attn=a, size=size, batch=args.batch, mode="infer"),
                                        device=args.device, warmup_kwargs=dict(size=64),
                                        threads=args.threads)["peak_mb"] for a in ATTNS}
            rows.append(dict(model=args.model, size=size, runtime=runtime, batch=args.batch, threads=args.threads,
                             laplacian_ms=lap.median_ms, softmax_ms=soft.median_ms, laplacian_iqr_ms=lap.iqr_ms,
                             softmax_iqr_ms=soft.iqr_ms, repeats=min(lap.repeats, soft.repeats),
                             ratio=lap.median_ms / soft.median_ms, laplacian_gmacs=macs["laplacian"] / 1e9,
                             softmax_gmacs=macs["softmax"] / 1e9, mac_ratio=macs["laplacian"] / macs["softmax"],
                             vector_op_ratio=work["laplacian"][1] / work["softmax"][1],
                             laplacian_peak_mib=peaks["laplacian"], softmax_peak_mib=peaks["softmax"],
                             target=TARGETS.get(size) if runtime == "eager" else None,
                             first_call_ms=first_ms))
            print(f"{size}² {runtime}: Laplacian {lap.median_ms:.1f} ms, SR-softmax {soft.median_ms:.1f} ms, "
                  f"ratio {lap.median_ms / soft.median_ms:.3f}", flush=True)
    return rows


def _peaks(row: dict) -> str:
    if row["laplacian_peak_mib"] is None:
        return "–"
    return f"{row['laplacian_peak_mib']:.0f} / {row['softmax_peak_mib']:.0f}"


def plot(path, rows: list[dict], title: str) -> None:
    fig, ax = figure(size=(6.5, 3.8))
    for runtime, marker in zip(RUNTIMES, "os^"):
        mine = [r for r in rows if r["runtime"] == runtime]
        if mine:
            ax.plot([r["size"] for r in mine], [r["ratio"] for r in mine], marker=marker, label=runtime)
    targets = sorted((s, t) for s, t in TARGETS.items() if any(r["size"] == s for r in rows))
    if targets:
        ax.plot(*zip(*targets), "k--", lw=1, label="target (eager)")
    ax.axhline(1.0, color="grey", lw=0.8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input side (pixels)")
    ax.set_ylabel("Laplacian / SR-softmax time")
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=9)
    save_figure(fig, path)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_options(p, batch=1)
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 512, 1024])
    p.add_argument("--runtimes", nargs="+", choices=RUNTIMES, default=["eager"])
    add_round_options(p, repeats=15, max_seconds=60.0, per="(size, runtime)")
    p.add_argument("--no-memory", dest="memory", action="store_false", help="skip the peak-memory processes")
    add_timing_options(p, threads=2)
    args = p.parse_args(argv)
    rows, stem, load = run_rows(args, "cpu_inference", run, argv)
    table = markdown_table(
        ["size", "runtime", "Laplacian ms", "SR-softmax ms", "Laplacian / SR-softmax", "target", "GMACs (Lap / SR)",
         "MAC ratio", "vector-op ratio", "peak RSS MiB (Lap / SR)", "IQR ms (Lap / SR)", "rounds"],
        [[f"{r['size']}²", r["runtime"], r["laplacian_ms"], r["softmax_ms"], r["ratio"],
          "–" if r["target"] is None else f"≤ {r['target']}", f"{r['laplacian_gmacs']:.3g} / {r['softmax_gmacs']:.3g}",
          r["mac_ratio"], r["vector_op_ratio"], _peaks(r), f"{r['laplacian_iqr_ms']:.3g} / {r['softmax_iqr_ms']:.3g}",
          r["repeats"]]
         for r in rows])
    header = report_header(f"{args.model}: CPU inference, Laplacian vs SR-softmax", args, load,
                           f"batch {args.batch}; {args.threads} thread(s); medians of round-robin calls")
    write_text(stem.with_suffix(".md"), header + table)
    print(header + table)
    plot(stem.with_suffix(".png"), rows, f"{args.model}: CPU inference, {args.threads} thread(s), batch {args.batch}")


if __name__ == "__main__":
    main()
