"""Images/s (training and inference) and peak memory of one backbone with three attentions, side by side.

    python -m benchmarks.model_throughput                       # Tiny at 224² and 512², CPU
    python -m benchmarks.model_throughput --device cuda --batch 8

Same LaplacianFormer backbone (default Tiny), attention "laplacian" | "gaussian" (same module, Gaussian
kernel) | "softmax" (PVTv2 spatial-reduction softmax, the quadratic baseline). Inference: forward under
no_grad in eval mode. Training: forward + cross-entropy + backward (no optimizer step) in train mode.
Peak memory: one call in a fresh subprocess (CPU: RSS high-water mark) or the CUDA allocator peak, see
``benchmarks/common.py``. Writes benchmarks/results/model_throughput_<device>.{json,md,png}.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.common import machine_info, markdown_table, peak_memory, plot_loglog, time_call, write_json  # noqa: E402
from laplacianformer.models import create_model  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
ATTNS = ("laplacian", "gaussian", "softmax")


def make_case(model: str, attn: str, size: int, batch: int, mode: str, device: str = "cpu", seed: int = 0):
    """Factory: builds the model and inputs, returns the zero-argument callable to time (``mode`` infer|train)."""
    torch.manual_seed(seed)
    net = create_model(model, attn=attn).to(device)
    x = torch.randn(batch, 3, size, size, device=device)
    if mode == "infer":
        net.eval()

        def run():
            with torch.no_grad():
                return net(x)

        return run
    net.train()
    target = torch.randint(0, net.num_classes, (batch,), device=device)

    def step():
        net.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), target)
        loss.backward()
        return loss

    return step


def run(args) -> list[dict]:
    from tqdm import tqdm

    rows = []
    cases = [(s, a, m) for s in args.sizes for a in args.attn for m in ("infer", "train")]
    for size, attn, mode in tqdm(cases, desc="model_throughput"):
        kwargs = dict(model=args.model, attn=attn, size=size, batch=args.batch, mode=mode, device=args.device)
        fn = make_case(**kwargs)
        timing = time_call(fn, device=args.device, warmup=1, repeats=args.repeats, max_seconds=args.max_seconds)
        del fn
        mem = None
        if not args.no_memory:
            mem = peak_memory(
                "benchmarks.model_throughput:make_case", kwargs, device=args.device,
                warmup_kwargs=dict(size=64, batch=1), threads=args.threads,
            )["peak_mb"]
        rows.append(dict(
            model=args.model, attn=attn, size=size, batch=args.batch, mode=mode, median_ms=timing.median_ms,
            iqr_ms=timing.iqr_ms, repeats=timing.repeats, images_per_s=args.batch * 1e3 / timing.median_ms, peak_mb=mem,
        ))
    return rows


def ratios(rows: list[dict]) -> list[dict]:
    """Laplacian and Gaussian relative to softmax, per (size, mode): time ratio (<1 faster), memory ratio."""
    out = []
    key = {(r["size"], r["mode"], r["attn"]): r for r in rows}
    for (size, mode, attn), r in key.items():
        base = key.get((size, mode, "softmax"))
        if attn == "softmax" or base is None:
            continue
        out.append(dict(
            size=size, mode=mode, attn=attn, time_vs_softmax=r["median_ms"] / base["median_ms"],
            memory_vs_softmax=(r["peak_mb"] / base["peak_mb"]) if r["peak_mb"] and base["peak_mb"] else None,
        ))
    return out


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="laplacianformer_tiny")
    p.add_argument("--sizes", type=int, nargs="+", default=[224, 512])
    p.add_argument("--attn", nargs="+", default=list(ATTNS), choices=ATTNS)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--max-seconds", type=float, default=20.0, help="cap on timed seconds per case")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    p.add_argument("--no-memory", action="store_true")
    p.add_argument("--out", default=None, help="output stem (default results/model_throughput_<device>)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load_before = os.getloadavg()
    rows = run(args)
    rel = ratios(rows)
    load = dict(before=load_before, after=os.getloadavg(), cpus=os.cpu_count())
    stem = Path(args.out) if args.out else RESULTS / f"model_throughput_{torch.device(args.device).type}"
    write_json(stem.with_suffix(".json"), dict(rows=rows, ratios=rel, load_average=load), settings=vars(args))
    table = markdown_table(
        ["attn", "size", "mode", "batch", "median ms", "IQR ms", "images/s", "peak MiB"],
        [[r["attn"], r["size"], r["mode"], r["batch"], r["median_ms"], r["iqr_ms"], r["images_per_s"], r["peak_mb"]] for r in rows],
    )
    table += "\n" + markdown_table(
        ["attn", "size", "mode", "time / softmax", "memory / softmax"],
        [[r["attn"], r["size"], r["mode"], r["time_vs_softmax"], r["memory_vs_softmax"]] for r in rel],
    )
    info = machine_info()
    header = (
        f"# {args.model} throughput ({args.device}; {info.get('cpu', '')}; torch {torch.__version__})\n\n"
        f"Load average (1 min) before/after: {load['before'][0]:.1f} / {load['after'][0]:.1f} on {load['cpus']} CPUs.\n\n"
    )
    stem.with_suffix(".md").write_text(header + table)
    print(header + table)
    panels = []
    for mode in ("infer", "train"):
        series = {a: ([r["size"] for r in rows if r["attn"] == a and r["mode"] == mode],
                      [r["images_per_s"] for r in rows if r["attn"] == a and r["mode"] == mode]) for a in args.attn}
        panels.append(dict(ylabel="images / s", title=mode, series=series))
    if not args.no_memory:
        series = {f"{a} {m}": ([r["size"] for r in rows if r["attn"] == a and r["mode"] == m],
                               [r["peak_mb"] for r in rows if r["attn"] == a and r["mode"] == m])
                  for a in args.attn for m in ("infer", "train")}
        panels.append(dict(ylabel="peak MiB", title="peak memory", series=series))
    plot_loglog(stem.with_suffix(".png"), panels, xlabel="image side (px)", title=f"{args.model}, batch {args.batch}")


if __name__ == "__main__":
    main()
