"""Per-image time and peak memory of RetinaNet (inference, one training step) against the image side.

    python -m laplacianformer.bench.detection_scaling --threads 2                    # tiny, 256..1024 px, CPU
    python -m laplacianformer.bench.detection_scaling --sizes 256 512 --repeats 3 --memory both
    python -m laplacianformer.bench.detection_scaling --device cuda --max-call-seconds 600

Same torchvision RetinaNet (FPN over stages 2-4 + P6/P7, 256 channels, min_size = max_size = the side,
docs/DETECTION.md) on the same LaplacianFormer backbone (default Tiny) with four token mixers:
"laplacian" (the paper's), "gaussian" (same Nyström module, Gaussian kernel), "sr-softmax" (PVTv2
spatial-reduction softmax) and "full-softmax" (``attn_kwargs={"sr_ratio": 1}``: softmax over all tokens,
quadratic in the token count). One square image (batch 1): "infer" is a forward under no_grad in eval
mode (with post-processing: decoding and NMS); "train" is forward with two target boxes + losses +
backward + an SGD step (no optimiser state). Timing: for each (side, mode) the variants run round-robin
(one call each per round, ``harness.round_robin``), so machine load hits them alike; one
untimed warm-up call each, then ``--repeats`` rounds (fewer once ``--max-seconds`` of timed calls are
spent); with ``--single-call`` each case is called once and that cold call's time is reported instead. Memory: "heap" is the live C-heap peak of one call sampled after every op (it doubles as the
warm-up); "rss" the RSS high-water mark of one call in a fresh process (``bench/harness.py``).
A case is skipped, with the reason recorded, when the time or heap peak extrapolated from the variant's
previous side (time ∝ side^4 for full softmax, side^2 for the others; heap ∝ side^2: torch's CPU
attention kernel never holds the whole attention matrix) exceeds ``--max-call-seconds`` / ``--max-memory-mb``.
Writes runs/bench/detection_scaling/detection_scaling_<device>[_retain].{json,md,png} (``--publish``:
benchmarks/results/).

On a shared CPU run it with ``OMP_WAIT_POLICY=PASSIVE``: with OpenMP's default spinning, each of 2 threads
burns its time slice waiting for the other when the cores are oversubscribed (measured here at load 11 on
2 cores: one RetinaNet training step at 256² took 24-35 s with 2 spinning threads, 3.5-4.3 s passive).
"""

from __future__ import annotations

import argparse
import os

import torch

from .harness import inference_call, peak_heap_mib, peak_memory, round_robin, timed
from .options import add_round_options, add_timing_options, start_timing_run, write_results
from .report import fit_exponent, markdown_table, plot_loglog, report_header, write_text
from ..detection.builders import build_detector

VARIANTS = {
    "laplacian": {},
    "gaussian": {"attn": "gaussian"},
    "sr-softmax": {"attn": "softmax"},
    "full-softmax": {"attn": "softmax", "attn_kwargs": {"sr_ratio": 1}},
}
"""Backbone keyword arguments of each row (``create_model``)."""
TIME_EXPONENT = {"full-softmax": 4.0}
"""Extrapolation exponent of time in the side (default 2: cost linear in the pixel count)."""
NUM_CLASSES = 11


def make_case(model: str, variant: str, size: int, mode: str, device: str = "cpu", fpn_channels: int = 256,
              seed: int = 0):
    """Factory: builds RetinaNet and one image, returns the zero-argument callable (``mode`` infer|train)."""
    torch.manual_seed(seed)
    net = build_detector("retinanet", model, NUM_CLASSES, img_size=size, fpn_channels=fpn_channels,
                         backbone_kwargs=VARIANTS[variant]).to(device)
    image = [torch.rand(3, size, size, device=device)]
    if mode == "infer":
        return inference_call(net, image)
    net.train()
    s = size / 256
    targets = [{"boxes": torch.tensor([[20.0, 30.0, 120.0, 140.0], [150.0, 60.0, 230.0, 200.0]], device=device) * s,
                "labels": torch.tensor([1, 2], device=device)}]
    opt = torch.optim.SGD(net.parameters(), lr=1e-5)

    def step():
        opt.zero_grad(set_to_none=True)
        loss = sum(net(image, targets).values())
        loss.backward()
        opt.step()
        return loss

    return step


def _predict(last: dict | None, size: int, exponent: float, key: str) -> float | None:
    if not last or last.get(key) is None:
        return None
    return last[key] * (size / last["size"]) ** exponent


def run(args) -> tuple[list[dict], list[dict]]:
    from tqdm import tqdm

    rows: list[dict] = []
    skipped: list[dict] = []
    last: dict[tuple[str, str], dict] = {}
    groups = [(s, m) for s in args.sizes for m in args.modes]
    for size, mode in tqdm(groups, desc="detection_scaling", disable=not args.progress):
        names = []
        for v in args.variants:
            prev = last.get((v, mode))
            if prev is None and any(r["variant"] == v and r["mode"] == mode for r in skipped):
                skipped.append(dict(variant=v, size=size, mode=mode, reason="skipped at a smaller side"))
                continue
            t = _predict(prev, size, TIME_EXPONENT.get(v, 2.0), "median_ms")
            mem = _predict(prev, size, 2.0, "heap_mb")
            if t is not None and t / 1e3 > args.max_call_seconds:
                skipped.append(dict(variant=v, size=size, mode=mode, reason=(
                    f"predicted {t / 1e3:.0f} s per call (from {prev['median_ms'] / 1e3:.1f} s at {prev['size']}², "
                    f"time ∝ side^{TIME_EXPONENT.get(v, 2.0):g}) > cap {args.max_call_seconds:g} s")))
                last.pop((v, mode), None)
                continue
            if mem is not None and mem > args.max_memory_mb:
                skipped.append(dict(variant=v, size=size, mode=mode, reason=(
                    f"predicted heap peak {mem:.0f} MiB > cap {args.max_memory_mb:g} MiB")))
                last.pop((v, mode), None)
                continue
            names.append(v)
        if not names:
            continue
        kwargs = {v: dict(model=args.model, variant=v, size=size, mode=mode, device=args.device,
                          fpn_channels=args.fpn_channels) for v in names}
        fns = {v: make_case(**kwargs[v]) for v in names}
        sample = args.device == "cpu" and args.memory in ("heap", "both")
        heap, first = {v: None for v in names}, {}
        for v, fn in fns.items():  # one call each under the heap sampler: the warm-up as well
            first[v] = timed(_sampled(fn, heap, v) if sample else fn, args.device)[0]
        if args.single_call:
            timings = {v: dict(median_ms=first[v], iqr_ms=None, repeats=0) for v in names}
        else:
            timings = {v: t.as_dict() for v, t in round_robin(fns, device=args.device, repeats=args.repeats,
                                                               max_seconds=args.max_seconds, warmup=False).items()}
        del fns
        for v in names:
            rss = None
            if args.memory in ("rss", "both") or args.device != "cpu":
                rss = peak_memory("laplacianformer.bench.detection_scaling:make_case", kwargs[v], device=args.device,
                                  warmup_kwargs=dict(size=64), threads=args.threads)["peak_mb"]
            t = timings[v]
            row = dict(model=args.model, variant=v, size=size, mode=mode, median_ms=t["median_ms"], iqr_ms=t["iqr_ms"],
                       repeats=t["repeats"], first_call_ms=first[v], heap_mb=heap[v], rss_mb=rss)
            rows.append(row)
            last[(v, mode)] = row
    return rows, skipped


def _sampled(fn, heap: dict, key: str):
    """``fn`` under the heap sampler, its peak stored in ``heap[key]``."""

    def call():
        heap[key] = peak_heap_mib(fn)

    return call


def ratios(rows: list[dict], base: str = "laplacian") -> list[dict]:
    """Each variant's time and memory relative to ``base`` at the same (side, mode); > 1: costs more."""
    key = {(r["size"], r["mode"], r["variant"]): r for r in rows}
    div = lambda a, b: a / b if a is not None and b else None  # noqa: E731
    out = []
    for (size, mode, v), r in key.items():
        b = key.get((size, mode, base))
        if v == base or b is None:
            continue
        out.append(dict(size=size, mode=mode, variant=v, time_ratio=div(r["median_ms"], b["median_ms"]),
                        heap_ratio=div(r["heap_mb"], b["heap_mb"]), rss_ratio=div(r["rss_mb"], b["rss_mb"])))
    return out


def exponents(rows: list[dict]) -> list[dict]:
    """Fitted log-log slope of time (and heap) against the pixel count, per (variant, mode)."""
    out = []
    for v in dict.fromkeys(r["variant"] for r in rows):
        for m in dict.fromkeys(r["mode"] for r in rows):
            pts = [r for r in rows if r["variant"] == v and r["mode"] == m]
            if len(pts) >= 2:
                px = [r["size"] ** 2 for r in pts]
                out.append(dict(variant=v, mode=m, sides=[r["size"] for r in pts],
                                time_exponent=fit_exponent(px, [r["median_ms"] for r in pts]),
                                heap_exponent=fit_exponent(px, [r["heap_mb"] for r in pts])))
    return out


def _cell(x, fmt):
    return "" if x is None else format(x, fmt)


def report(args, rows, skipped, rel, exps, load) -> str:
    header = report_header(f"RetinaNet + {args.model} per-image cost against the side", args, load,
                           extra=f"{torch.get_num_threads()} threads; OMP_WAIT_POLICY={args.omp_wait_policy or 'unset'}")
    table = markdown_table(
        ["variant", "side", "mode", "ms / image", "IQR ms", "timed rounds", "first call ms", "heap peak MiB",
         "RSS peak MiB"],
        [[r["variant"], r["size"], r["mode"], _cell(r["median_ms"], ".0f"), _cell(r["iqr_ms"], ".0f"),
          r["repeats"] or "0 (first call)", _cell(r["first_call_ms"], ".0f"), _cell(r["heap_mb"], ".0f"),
          _cell(r["rss_mb"], ".0f")] for r in rows])
    table += "\n" + markdown_table(
        ["side", "mode", "variant", "time / laplacian", "heap / laplacian", "RSS / laplacian"],
        [[r["size"], r["mode"], r["variant"], _cell(r["time_ratio"], ".2f"), _cell(r["heap_ratio"], ".2f"),
          _cell(r["rss_ratio"], ".2f")] for r in rel])
    if exps:
        table += "\n" + markdown_table(
            ["variant", "mode", "sides", "time ∝ pixels^k", "heap ∝ pixels^k"],
            [[e["variant"], e["mode"], " ".join(map(str, e["sides"])), _cell(e["time_exponent"], ".2f"),
              _cell(e["heap_exponent"], ".2f")] for e in exps])
    if skipped:
        table += "\nSkipped:\n\n" + "".join(f"- {s['variant']} {s['mode']} at {s['size']}²: {s['reason']}\n" for s in skipped)
    return header + table


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="laplacianformer_tiny")
    p.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 768, 1024])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    p.add_argument("--modes", nargs="+", default=["infer", "train"], choices=["infer", "train"])
    p.add_argument("--fpn-channels", type=int, default=256)
    add_round_options(p, repeats=3, max_seconds=120.0, per="(side, mode)")
    p.add_argument("--max-call-seconds", type=float, default=60.0, help="skip a case predicted to take longer per call")
    p.add_argument("--max-memory-mb", type=float, default=8192.0, help="skip a case predicted to need a larger heap peak")
    p.add_argument("--single-call", action="store_true",
                   help="call each case once (under the heap sampler) and report that cold call's time: no warm-up, "
                        "no timed rounds (for a loaded machine or a tight time budget)")
    p.add_argument("--memory", choices=["heap", "rss", "both", "none"], default="both")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    add_timing_options(p)
    args = p.parse_args(argv)
    load_before = start_timing_run(args, "laplacianformer.bench.detection_scaling", argv)
    args.omp_wait_policy = os.environ.get("OMP_WAIT_POLICY")
    rows, skipped = run(args)
    rel, exps = ratios(rows), exponents(rows)
    stem, load = write_results(args, "detection_scaling", load_before,
                               dict(rows=rows, skipped=skipped, ratios=rel, exponents=exps))
    text = report(args, rows, skipped, rel, exps, load)
    write_text(stem.with_suffix(".md"), text)
    print(text)
    panels = []
    for mode in args.modes:
        series = {v: ([r["size"] for r in rows if r["variant"] == v and r["mode"] == mode],
                      [r["median_ms"] for r in rows if r["variant"] == v and r["mode"] == mode]) for v in args.variants}
        panels.append(dict(ylabel="ms per image", title=f"RetinaNet {mode}", series={k: xy for k, xy in series.items() if xy[0]}))
    if args.memory != "none":
        key = "heap_mb" if args.memory in ("heap", "both") and args.device == "cpu" else "rss_mb"
        series = {f"{v} {m}": ([r["size"] for r in rows if r["variant"] == v and r["mode"] == m and r[key]],
                               [r[key] for r in rows if r["variant"] == v and r["mode"] == m and r[key]])
                  for v in args.variants for m in args.modes}
        panels.append(dict(ylabel=f"{'heap' if key == 'heap_mb' else 'RSS'} peak MiB", title="peak memory",
                           series={k: xy for k, xy in series.items() if xy[0]}))
    plot_loglog(stem.with_suffix(".png"), panels, xlabel="image side (px)",
                title=f"RetinaNet + {args.model}, batch 1, {torch.get_num_threads()} threads")


if __name__ == "__main__":
    main()
