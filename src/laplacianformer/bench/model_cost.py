"""Cost per image against resolution: time and peak memory of one backbone with each attention, side by side.

The demo's cost panel (``laplacianformer bench model_cost``, ``python -m laplacianformer.bench.model_cost``);
``bench.model_throughput`` builds its calls here too. Timing and memory come from ``bench.harness``. Linear
versus quadratic attention cost is DESIGN.md §2; the backbone is DESIGN.md §5.

- **Calls.** ``infer``: forward under ``no_grad`` in eval mode. ``train``: zero_grad, forward,
  cross-entropy, backward in train mode (the optimiser step is per-parameter work, the same at every size,
  and is left out).
- **Time** (``round_robin``): the cells of one (size, mode) run round-robin, one call each per round, so
  load changes on a shared machine hit every attention alike; wall and CPU (process) milliseconds per call,
  median over the rounds. One untimed warm-up call each; a cell whose warm-up exceeds ``cap_s`` is skipped
  with its reason (and so are its larger sizes).
- **Peak memory**: the live C-heap peak of one call (``harness.peak_heap_mib``).
- **Activations** (train): what autograd keeps for the backward of one forward (``harness.saved_activation_mib``).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Mapping, Sequence

import torch

from .harness import inference_call, peak_heap_mib, round_robin, saved_activation_mib, timed
from .options import add_round_options
from .output import add_output_options, output_stem
from .report import fit_exponent, write_text
SIZES = (224, 512, 768, 1024)
MODES = ("infer", "train")
MODEL = "laplacianformer_micro"
MODEL_KWARGS = {"stem_stride": 4}


def build_net(model: str, attn: str, *, attn_kwargs: Mapping | None = None, model_kwargs: Mapping | None = None,
              device="cpu", seed: int = 0) -> torch.nn.Module:
    """The backbone with one attention (1000 classes, 3 channels), seeded."""
    from ..models import create_model

    torch.manual_seed(seed)
    return create_model(model, attn=attn, attn_kwargs=dict(attn_kwargs or {}) or None,
                        **dict(model_kwargs or {})).to(device)


def make_call(net: torch.nn.Module, size: int, mode: str, *, batch: int = 1, device="cpu",
              seed: int = 0) -> Callable[[], object]:
    """The zero-argument call to measure: ``infer`` (no_grad forward, eval) or ``train`` (forward + loss +
    backward, train mode) on a seeded batch of ``batch`` random ``size``² images."""
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {list(MODES)}, got {mode!r}")
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, net.in_chans, size, size, generator=g).to(device)
    if mode == "infer":
        return inference_call(net, x)
    net.train()
    target = torch.randint(0, net.num_classes, (batch,), generator=g).to(device)

    def step():
        net.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(net(x), target)
        loss.backward()
        return loss

    return step


def training_activation_mib(net: torch.nn.Module, size: int, *, batch: int = 1, device="cpu", seed: int = 0) -> float:
    """``saved_activation_mib`` of one training forward of ``net`` on ``batch`` random ``size``² images."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, net.in_chans, size, size, generator=g).to(device)
    net.train()
    return saved_activation_mib(lambda: net(x), exclude=list(net.parameters()))


def measure_cost(*, model: str = MODEL, attns: Sequence[str] | None = None, sizes: Sequence[int] = SIZES,
                 modes: Sequence[str] = MODES, batch: int = 1, repeats: int = 3, max_seconds: float | None = 20.0,
                 cap_s: float = 30.0, model_kwargs: Mapping | None = None, device="cpu",
                 log: Callable[[str], None] | None = None) -> list[dict]:
    """One cell per (size, mode, attn): wall/CPU ms per image, peak heap MiB, activation MiB (train).

    Sizes are measured in increasing order; per (size, mode) the attentions run round-robin
    (``repeats`` rounds, stopping once ``max_seconds`` of timed calls are spent). A cell whose warm-up call
    took over ``cap_s`` seconds is recorded with ``skipped`` (the reason) and no timing, and the larger sizes
    of that (attn, mode) are skipped without running."""
    from ..layers.token_mixer import ATTENTIONS

    attns = list(attns or ATTENTIONS)
    model_kwargs = dict(MODEL_KWARGS if model_kwargs is None else model_kwargs)
    cells: list[dict] = []
    over: dict[tuple[str, str], str] = {}
    for size in sorted(sizes):
        for mode in modes:
            nets, fns = {}, {}
            for attn in attns:
                if (attn, mode) in over:
                    cells.append(dict(size=size, mode=mode, attn=attn, batch=batch, skipped=over[(attn, mode)]))
                    continue
                nets[attn] = build_net(model, attn, model_kwargs=model_kwargs, device=device)
                fns[attn] = make_call(nets[attn], size, mode, batch=batch, device=device)
            # warm-up calls first, so a cell over the cap is dropped before the timed rounds
            for attn in list(fns):
                warm_ms = timed(fns[attn], device)[0]
                if warm_ms / 1e3 > cap_s:
                    reason = f"warm-up call took {warm_ms / 1e3:.1f} s > cap {cap_s:g} s at {size}²"
                    over[(attn, mode)] = f"a smaller size was over the cap ({reason})"
                    cells.append(dict(size=size, mode=mode, attn=attn, batch=batch, skipped=reason))
                    del fns[attn], nets[attn]
            t0 = time.perf_counter()
            timings = round_robin(fns, repeats=repeats, max_seconds=max_seconds, device=device, warmup=False)
            for attn, fn in fns.items():
                t = timings[attn]
                heap = peak_heap_mib(fn) if torch.device(device).type == "cpu" else None
                saved = (training_activation_mib(nets[attn], size, batch=batch, device=device)
                         if mode == "train" else None)
                cells.append(dict(
                    size=size, mode=mode, attn=attn, batch=batch, tokens_stage1=_stage1_tokens(nets[attn], size),
                    ms_per_image=t.median_ms / batch, iqr_ms=t.iqr_ms, cpu_ms_per_image=t.cpu_ms / batch,
                    repeats=t.repeats, peak_heap_mib=None if heap is None else heap / batch,
                    activations_mib=None if saved is None else saved / batch, skipped=None,
                ))
            if log is not None:
                done = [c for c in cells if c["size"] == size and c["mode"] == mode and not c.get("skipped")]
                log(f"[cost] {size}² {mode}: " + ", ".join(
                    f"{c['attn']} {c['ms_per_image']:.0f} ms, {c['peak_heap_mib'] or 0:.0f} MiB" for c in done)
                    + f" ({time.perf_counter() - t0:.0f} s)")
            del fns, nets
    order = {a: i for i, a in enumerate(attns)}
    return sorted(cells, key=lambda c: (c["size"], MODES.index(c["mode"]), order[c["attn"]]))


def _stage1_tokens(net: torch.nn.Module, size: int) -> int:
    side = -(-size // net.feature_info[0]["reduction"])
    return side * side


def ratios(cells: Sequence[dict], base: str = "softmax") -> list[dict]:
    """Each attention relative to ``base`` per (size, mode): time, CPU time, peak heap, activations (<1: less)."""
    key = {(c["size"], c["mode"], c["attn"]): c for c in cells if not c.get("skipped")}
    out = []
    for (size, mode, attn), c in key.items():
        b = key.get((size, mode, base))
        if attn == base or b is None:
            continue
        div = lambda x, y: x / y if x and y else None
        out.append(dict(size=size, mode=mode, attn=attn, base=base,
                        time=div(c["ms_per_image"], b["ms_per_image"]),
                        cpu_time=div(c["cpu_ms_per_image"], b["cpu_ms_per_image"]),
                        peak_heap=div(c["peak_heap_mib"], b["peak_heap_mib"]),
                        activations=div(c.get("activations_mib"), b.get("activations_mib"))))
    return out


def crossover(cells: Sequence[dict], attn: str, base: str = "softmax", mode: str = "infer",
              field: str = "ms_per_image", tol: float = 0.0) -> int | None:
    """The smallest measured size from which ``attn`` stays at or below ``base`` · (1 + ``tol``) in ``field``
    (None: never)."""
    sizes = sorted({c["size"] for c in cells})
    key = {(c["size"], c["attn"]): c for c in cells if c["mode"] == mode and not c.get("skipped")}
    below = [s for s in sizes if (s, attn) in key and (s, base) in key
             and key[(s, attn)][field] is not None and key[(s, base)][field] is not None
             and key[(s, attn)][field] <= key[(s, base)][field] * (1 + tol)]
    for s in below:
        if all(t in below for t in sizes if t >= s and (t, attn) in key and (t, base) in key):
            return s
    return None


def growth_exponents(cells: Sequence[dict], field: str = "cpu_ms_per_image") -> dict[str, dict[str, float]]:
    """attn -> mode -> least-squares slope of log ``field`` on log stage-1 tokens over the measured sizes
    (1: linear in the tokens, 2: quadratic); only where at least two sizes were measured."""
    out: dict[str, dict[str, float]] = {}
    for attn in dict.fromkeys(c["attn"] for c in cells):
        for mode in MODES:
            pts = [(c["tokens_stage1"], c[field]) for c in cells
                   if c["attn"] == attn and c["mode"] == mode and not c.get("skipped") and c.get(field)]
            slope = fit_exponent([x for x, _ in pts], [y for _, y in pts])
            if slope is not None:
                out.setdefault(attn, {})[mode] = slope
    return out


def cost_table(cells: Sequence[dict]) -> str:
    """Markdown: one row per (size, attention); forward and training-step time and memory per image."""
    by = {(c["size"], c["attn"], c["mode"]): c for c in cells}
    attns = list(dict.fromkeys(c["attn"] for c in cells))
    lines = ["| size | stage-1 tokens | attention | forward ms | forward CPU ms | forward peak MiB | train-step ms "
             "| train-step CPU ms | train-step peak MiB | activations MiB |", "|" + "---|" * 10]

    def f(c, key):
        if c is None:
            return "n/a"
        if c.get("skipped"):
            return "skipped"
        v = c.get(key)
        return "n/a" if v is None else f"{v:.0f}" if v >= 100 else f"{v:.3g}"

    for size in sorted({c["size"] for c in cells}):
        for attn in attns:
            i, t = by.get((size, attn, "infer")), by.get((size, attn, "train"))
            tokens = next((c.get("tokens_stage1") for c in (i, t) if c and c.get("tokens_stage1")), None)
            lines.append(f"| {size}² | {tokens or ''} | {attn} | {f(i, 'ms_per_image')} | {f(i, 'cpu_ms_per_image')} "
                         f"| {f(i, 'peak_heap_mib')} | {f(t, 'ms_per_image')} | {f(t, 'cpu_ms_per_image')} "
                         f"| {f(t, 'peak_heap_mib')} | {f(t, 'activations_mib')} |")
    skipped = [c for c in cells if c.get("skipped")]
    notes = "".join(f"\n- skipped {c['attn']} {c['mode']} at {c['size']}²: {c['skipped']}" for c in skipped)
    return "\n".join(lines) + "\n" + (notes + "\n" if notes else "")


def main(argv: Sequence[str] | None = None) -> int:
    from ..layers.token_mixer import ATTENTIONS
    from ..train.plots import plot_cost

    p = argparse.ArgumentParser(prog="python -m laplacianformer.bench.model_cost", description=__doc__.split("\n")[0],
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--model", default=MODEL)
    p.add_argument("--model-kwargs", type=json.loads, default=MODEL_KWARGS, help="JSON object of model overrides")
    p.add_argument("--attns", default=",".join(ATTENTIONS))
    p.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    add_round_options(p, repeats=3, max_seconds=20.0, per="(size, mode)")
    p.add_argument("--cap-s", type=float, default=30.0, help="skip a cell whose warm-up call takes longer")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    add_output_options(p)
    args = p.parse_args(argv)
    stem = output_stem(args, "model_cost", "model_cost_cpu")
    torch.set_num_threads(args.threads)
    t0, c0, load0 = time.perf_counter(), time.process_time(), os.getloadavg()
    cells = measure_cost(model=args.model, attns=[a for a in args.attns.split(",") if a], sizes=args.sizes,
                         repeats=args.repeats, max_seconds=args.max_seconds, cap_s=args.cap_s,
                         model_kwargs=args.model_kwargs, log=lambda m: print(m, file=sys.stderr, flush=True))
    settings = dict(model=args.model, model_kwargs=args.model_kwargs, batch=1, threads=args.threads,
                    repeats=args.repeats, max_seconds=args.max_seconds, cap_s=args.cap_s, sizes=sorted(args.sizes),
                    wall_s=time.perf_counter() - t0, cpu_s=time.process_time() - c0,
                    load_average_before=load0, load_average_after=os.getloadavg(), torch=torch.__version__)
    record = dict(settings=settings, cells=cells, ratios=ratios(cells))
    write_text(stem.with_suffix(".json"), json.dumps(record, indent=1) + "\n")
    write_text(stem.with_suffix(".md"), cost_table(cells))
    plot_cost(cells, stem.with_suffix(".png"), title=f"{args.model} (stem stride "
                                                     f"{args.model_kwargs.get('stem_stride', 4)}), batch 1, "
                                                     f"{args.threads} thread(s)")
    print(f"wrote {stem}.json, .md, .png", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
