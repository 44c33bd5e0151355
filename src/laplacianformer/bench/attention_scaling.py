"""Attention scaling benchmark: forward+backward time and peak memory versus the token count N.

Every method runs side by side in one process, on (B, H, N, d) = (1, 2, N, 32) tensors over square 2-D
token grids (default 32x32 ... 256x256, i.e. 1k to 64k tokens), m = 49 (7x7) landmarks:
    laplacian            ours, laplacian_attention with the default kernel dispatch
    laplacian_composite  ours as a plain-PyTorch composite: torch.cdist kernels and the autograd
                         normalisation (the "naive composite" the fast path replaces)
    laplacian_exact      the exact O(N^2) Laplacian kernel (landmarks=None), small N only
    soft                 SOFT: Gaussian kernel, tied keys, same Nystrom machinery (baselines.soft)
    softmax_sdpa         torch scaled_dot_product_attention
    performer            FAVOR+ with 256 orthogonal random features
    nystromformer        Nystromformer with 49 segment-mean landmarks, 6 pinv iterations

    python -m laplacianformer.bench.attention_scaling --threads 1          # the full run: runs/bench/attention_scaling/
    python -m laplacianformer.bench.attention_scaling --threads 1 --publish  # the same into ./benchmarks/results/
    python -m laplacianformer.bench.attention_scaling --quick --no-memory  # seconds: tiny sizes, one repeat

On a shared CPU, --threads 1 gives far steadier numbers: with several threads every small op pays an
OpenMP barrier, which costs milliseconds when the cores are oversubscribed.

A method whose single call exceeds --cap-seconds is not run at larger N ("skipped (cap)"), nor one whose call
failed ("skipped (error)"; the error is in the JSON and on stderr). Time is the
median of --repeats calls after one warm-up; memory is measured by bench.harness.peak_memory (a fresh
subprocess per case on CPU). The time exponent is the least-squares slope of log time on log N between
4k and 64k tokens.
"""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from pathlib import Path

import torch

from .backends import composite_operator
from .harness import peak_memory, time_call
from .machine import machine_info
from .output import add_output_options, output_stem
from .report import fit_exponent, markdown_table, plot_loglog, write_json, write_text
from ..baselines import (
    nystrom_attention,
    orthogonal_random_features,
    performer_attention,
    soft_attention,
    softmax_attention,
)
from ..ops import explain, laplacian_attention

METHODS = (
    "laplacian",
    "laplacian_composite",
    "laplacian_exact",
    "soft",
    "softmax_sdpa",
    "performer",
    "nystromformer",
)
DEFAULT_SIDES = (32, 45, 64, 91, 128, 181, 256)
QUICK_SIDES = (8, 12)
WARMUP_SIDE = 8
FIT_RANGE = (4096, 65536)
BATCH, HEADS, HEAD_DIM, LANDMARKS = 1, 2, 32, (7, 7)
PERFORMER_FEATURES = 256
NYSTROM_ITERS = 6


def attention_fn(method: str, hw: tuple[int, int]):
    """(q, k, v) -> (B, H, N, d) output of ``method`` on an (h, w) token grid."""
    m = LANDMARKS[0] * LANDMARKS[1]
    if method == "laplacian":
        return lambda q, k, v: laplacian_attention(q, k, v, hw=hw, landmarks=LANDMARKS)
    if method == "laplacian_composite":

        def run(q, k, v):
            with composite_operator():
                return laplacian_attention(q, k, v, hw=hw, landmarks=LANDMARKS)

        return run
    if method == "laplacian_exact":
        return lambda q, k, v: laplacian_attention(q, k, v, hw=hw, landmarks=None)
    if method == "soft":
        return lambda q, k, v: soft_attention(q, v, hw=hw, landmarks=LANDMARKS)
    if method == "softmax_sdpa":
        return softmax_attention
    if method == "performer":
        gen = torch.Generator().manual_seed(0)
        projection = orthogonal_random_features(PERFORMER_FEATURES, HEAD_DIM, generator=gen)
        return lambda q, k, v: performer_attention(q, k, v, projection.to(q.device))
    if method == "nystromformer":
        return lambda q, k, v: nystrom_attention(q, k, v, num_landmarks=m, iters=NYSTROM_ITERS)
    raise ValueError(f"method: expected one of {list(METHODS)}, got {method!r}")


def _default_dispatch(device: str) -> str:
    """What the kernel selector runs for this benchmark's shapes by default (its own explanation)."""
    x = torch.zeros(BATCH, HEADS, 64, HEAD_DIM, device=device)
    y = torch.zeros(BATCH, HEADS, LANDMARKS[0] * LANDMARKS[1], HEAD_DIM, device=device)
    return explain("kernel", x, y, 4.0, "laplacian") + "\n" + explain("kernel_matmul", x, y, torch.zeros_like(y), 4.0,
                                                                      "laplacian")


def make_case(method: str, side: int, device: str = "cpu", seed: int = 0):
    """Builds inputs for an (side x side) grid and returns a zero-argument forward+backward callable."""
    gen = torch.Generator().manual_seed(seed)
    n = side * side
    shape = (BATCH, HEADS, n, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=gen).to(device).requires_grad_() for _ in range(3))
    grad = torch.randn(shape, generator=gen).to(device)
    fn = attention_fn(method, (side, side))

    def step():
        for t in (q, k, v):
            t.grad = None
        out = fn(q, k, v)
        out.backward(grad)
        return out

    return step


def run(args) -> dict:
    from tqdm import tqdm

    sides = args.sizes
    capped: dict[str, tuple[int, str]] = {}  # method -> (N, "cap" | "error") of the call that stopped it
    records = []
    cases = [(side, method) for side in sides for method in args.methods]
    for side, method in tqdm(cases, desc="attention scaling", unit="case"):
        n = side * side
        rec = {"method": method, "side": side, "n": n, "status": "ok", "time": None, "memory": None}
        records.append(rec)
        if method in capped:
            at, why = capped[method]
            rec["status"] = f"skipped ({why})"
            rec["note"] = (f"the call at N={at} failed" if why == "error"
                           else f"a call at N={at} exceeded {args.cap_seconds:g} s")
            continue
        if method == "laplacian_exact" and n > args.exact_max_n:
            rec["status"] = "skipped (exact)"
            rec["note"] = f"--exact-max-n {args.exact_max_n}"
            continue
        try:
            step = make_case(method, side, args.device)
            timing = time_call(
                step, device=args.device, warmup=1, repeats=args.repeats, max_seconds=args.cap_seconds * args.repeats
            )
            rec["time"] = timing.as_dict()
            del step
            if args.memory:
                rec["memory"] = peak_memory(
                    "laplacianformer.bench.attention_scaling:make_case",
                    {"method": method, "side": side, "device": args.device},
                    device=args.device,
                    timeout=max(120.0, 20 * args.cap_seconds),
                    warmup_kwargs={"side": WARMUP_SIDE},
                    threads=args.threads,
                )
        except Exception as exc:
            rec["status"] = f"error: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            traceback.print_exc(file=sys.stderr)
            capped[method] = (n, "error")
            continue
        if min(timing.warmup_ms + [timing.median_ms]) / 1e3 > args.cap_seconds:
            capped[method] = (n, "cap")
    exponents = {}
    for method in args.methods:
        pts = [
            (r["n"], r["time"]["median_ms"])
            for r in records
            if r["method"] == method and r["time"] and FIT_RANGE[0] <= r["n"] <= FIT_RANGE[1]
        ]
        exponents[method] = {
            "exponent": fit_exponent([p[0] for p in pts], [p[1] for p in pts]),
            "points": len(pts),
            "range": [min((p[0] for p in pts), default=None), max((p[0] for p in pts), default=None)],
        }
    return {"records": records, "time_exponent_4k_64k": exponents}


def _cell(rec: dict) -> str:
    if rec["status"] != "ok":
        return rec["status"].split(":")[0]
    mem = rec["memory"]
    t = rec["time"]
    text = f"{t['median_ms']:.4g} ms"
    if mem is not None:
        text += f" / {mem['peak_mb']:.4g} MB"
    return text


def markdown_report(result: dict, args, info: dict) -> str:
    records = result["records"]
    header = ["N (grid)"] + list(args.methods)
    rows = []
    for side in args.sizes:
        row = [f"{side * side} ({side}x{side})"]
        for method in args.methods:
            rec = next(r for r in records if r["method"] == method and r["side"] == side)
            row.append(_cell(rec))
        rows.append(row)
    exp_row = ["time exponent 4k-64k"]
    for method in args.methods:
        e = result["time_exponent_4k_64k"][method]
        exp_row.append("n/a" if e["exponent"] is None else f"{e['exponent']:.2f} ({e['points']} pts)")
    rows.append(exp_row)
    gpu = f", GPU {info['gpu']}" if info["gpu"] else ""
    lines = [
        "# Attention scaling: forward+backward time and peak memory",
        "",
        f"Device `{args.device}`; {info['cpu']}, {info['cpu_count']} cores, torch threads {info['torch_threads']}"
        f"{gpu}; torch {info['torch']}, triton {info['triton']}.",
        f"B={BATCH}, H={HEADS}, d={HEAD_DIM}, m={LANDMARKS[0] * LANDMARKS[1]} ({LANDMARKS[0]}x{LANDMARKS[1]}) landmarks,"
        f" Performer {PERFORMER_FEATURES} features, Nystromformer {NYSTROM_ITERS} pinv iterations, float32.",
        f"Each cell: median of {args.repeats} timed calls after one warm-up (one when a call exceeds the cap) /"
        " peak memory above the inputs (CPU: peak RSS increase of a fresh subprocess after an 8x8 warm-up"
        " call of the same method; CUDA: max_memory_allocated).",
        f"Load average (1 min) when the table was written: {os.getloadavg()[0]:.2f} on {info['cpu_count']} cores."
        " These machines are shared: treat single cells as rough (the IQR of every cell is in the JSON) and"
        " compare methods within a row.",
        f"Cap: a method whose call exceeded {args.cap_seconds:g} s is not run at larger N.",
        "",
    ]
    return "\n".join(lines) + markdown_table(header, rows)


def plot(result: dict, args, path: Path) -> None:
    time_series, mem_series = {}, {}
    for method in args.methods:
        recs = [r for r in result["records"] if r["method"] == method and r["time"]]
        time_series[method] = ([r["n"] for r in recs], [r["time"]["median_ms"] for r in recs])
        mem_series[method] = ([r["n"] for r in recs], [r["memory"]["peak_mb"] if r["memory"] else None for r in recs])
    panels = [{"ylabel": "forward+backward time (ms)", "series": time_series, "title": "time"}]
    if args.memory:
        panels.append({"ylabel": "peak memory above inputs (MB)", "series": mem_series, "title": "peak memory"})
    plot_loglog(path, panels, xlabel="tokens N", title=f"Attention scaling ({args.device}, B=1, H=2, d=32)")


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", help="grid sides (N = side^2); default 32 45 64 91 128 181 256")
    p.add_argument("--methods", nargs="+", choices=METHODS, default=list(METHODS))
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--quick", action="store_true", help="tiny sizes (8x8, 12x12) and one repeat")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--cap-seconds", type=float, default=8.0, help="skip larger N once a call exceeds this")
    p.add_argument("--exact-max-n", type=int, default=4096, help="largest N for laplacian_exact")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True, help="measure peak memory")
    add_output_options(p)
    args = p.parse_args(argv)
    if args.quick:
        args.sizes = args.sizes or list(QUICK_SIDES)
        args.repeats = 1
    args.sizes = sorted(args.sizes or DEFAULT_SIDES)
    if min(args.sizes) < max(LANDMARKS):
        p.error(f"--sizes: every side must be >= {max(LANDMARKS)} (the 7x7 landmark grid)")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    out = output_stem(args, "attention_scaling", f"attention_scaling_{torch.device(args.device).type}")
    info = machine_info()
    result = run(args)
    settings = {
        "batch": BATCH,
        "heads": HEADS,
        "head_dim": HEAD_DIM,
        "landmarks": list(LANDMARKS),
        "performer_features": PERFORMER_FEATURES,
        "nystrom_iters": NYSTROM_ITERS,
        "dtype": "float32",
        "device": args.device,
        "sizes": args.sizes,
        "methods": args.methods,
        "repeats": args.repeats,
        "torch_threads": torch.get_num_threads(),
        "cap_seconds": args.cap_seconds,
        "exact_max_n": args.exact_max_n,
        "composite_backend": "bench.backends.composite_operator(): ops.use(kernel='composite', "
                             "newton_schulz='torch', newton_schulz_grad='torch', normalization='composite')",
        "default_dispatch": _default_dispatch(args.device),
        "time_exponent_fit_range": list(FIT_RANGE),
    }
    write_json(out.with_suffix(".json"), result, settings=settings)
    report = markdown_report(result, args, info)
    write_text(out.with_suffix(".md"), report)
    plot(result, args, out.with_suffix(".png"))
    print(report)
    print(f"wrote {out}.json, .md, .png")
    return result


if __name__ == "__main__":
    main()
