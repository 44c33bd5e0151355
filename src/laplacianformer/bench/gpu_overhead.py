"""Where a backbone's inference time goes on a GPU: the launches and host work around the kernels.

    python -m laplacianformer.bench.gpu_overhead --device cuda                       # Tiny, 512², batch 8
    python -m laplacianformer.bench.gpu_overhead --device cpu --model laplacianformer_micro --size 64 --batch 2 \
        --no-compile

The first H200 run (benchmarks/results/gpu_check_h200) timed the Tiny backbone at 27.7 ms (224²) and 30.2 ms
(512²) per batch of 8 with Laplacian attention: nearly flat in the token count, so the time is not in the
kernels' arithmetic. This script separates the parts, per attention, in one run:

- ``eager ms``: the model as users call it (median of ``--repeats`` synchronised calls);
- ``kernels ms`` and ``launches``: the summed device time and the number of device kernels of one eager
  forward, from ``torch.profiler`` (CUDA only); eager ms minus kernels ms is host work and launch gaps;
- ``graph ms``: the same forward captured once in a CUDA graph and replayed (launch gaps and host work gone;
  CUDA only; a forward that cannot be captured says why);
- ``compiled ms`` and ``compile s``: ``torch.compile(model, fullgraph=True)`` (inductor), the first call's
  seconds and the later calls' median; ``max |diff|`` compares its output with eager.
Inference only (eval, no_grad, float32; ``--autocast bf16``: every part under one ``torch.autocast`` without
its weight-cast cache, which a captured graph cannot use). Writes
runs/bench/gpu_overhead/gpu_overhead_<device>[_bf16].{json,md}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
import sys
import time

import torch

from .harness import synchronize, time_call
from .options import add_autocast_option, add_model_options, autocast_context, precision_name
from .output import add_output_options, output_stem
from .report import markdown_table, write_json, write_text
from .model_cost import build_net


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:160] if str(exc).strip() else ''}"


def profile_forward(net, x, device: str) -> dict:
    """Summed device-kernel milliseconds and kernel count of one forward (CUDA; empty on CPU)."""
    if torch.device(device).type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        net(x)
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(e.device_time for e in kernels)
    return {"kernels_ms": total_us / 1e3, "launches": len(kernels)}


def graph_replay(net, x, repeats: int) -> dict:
    """Median ms of replaying one forward captured in a CUDA graph (``laplacianformer.cuda_graphed``, its
    output buffers as they are), and the largest |difference| from eager."""
    from ..models.cuda_graph import cuda_graphed

    graphed = cuda_graphed(net, x, warmup=3, clone_outputs=False)
    static_out = graphed(x)
    torch.cuda.synchronize()
    diff = (static_out - net(x)).abs().max().item()
    timing = time_call(graphed.graph.replay, device="cuda", warmup=2, repeats=repeats)
    return {"graph_ms": timing.median_ms, "graph_max_abs_diff": diff}


def compiled(net, x, device: str, repeats: int) -> dict:
    torch._dynamo.reset()
    fn = torch.compile(net, fullgraph=True)
    synchronize(device)
    t0 = time.perf_counter()
    out = fn(x)
    synchronize(device)
    first = time.perf_counter() - t0
    diff = (out - net(x)).abs().max().item()
    timing = time_call(lambda: fn(x), device=device, warmup=2, repeats=repeats)
    return {"compile_s": first, "compiled_ms": timing.median_ms, "compiled_max_abs_diff": diff}


def measure(attn: str, args) -> dict:
    row: dict = {"attn": attn, "precision": precision_name(args.autocast)}
    net = build_net(args.model, attn, device=args.device).eval()
    x = torch.randn(args.batch, 3, args.size, args.size, generator=torch.Generator().manual_seed(0)).to(args.device)
    with torch.no_grad(), autocast_context(args.device, args.autocast, cache=False):
        row["eager_ms"] = time_call(lambda: net(x), device=args.device, warmup=3, repeats=args.repeats).median_ms
        for name, part in (
            ("profile", lambda: profile_forward(net, x, args.device)),
            ("graph", lambda: graph_replay(net, x, args.repeats) if args.device == "cuda" else {}),
            ("compile", lambda: compiled(net, x, args.device, args.repeats) if args.compile else {}),
        ):
            try:
                row.update(part())
            except Exception as exc:  # a part that fails is reported, the others still run
                row[f"{name}_error"] = _error(exc)
                print(f"{attn}: {name} failed: {row[f'{name}_error']}", file=sys.stderr)
    return row


def table(rows: list[dict]) -> str:
    cols = [("attn", "attn"), ("eager_ms", "eager ms"), ("kernels_ms", "kernels ms"), ("launches", "launches"),
            ("graph_ms", "graph ms"), ("compiled_ms", "compiled ms"), ("compile_s", "compile s"),
            ("compiled_max_abs_diff", "compiled max abs diff")]
    body = [[r.get(k, r.get(k.split("_")[0] + "_error", "")) for k, _ in cols] for r in rows]
    notes = [f"- {r['attn']} {k[:-6]}: {v}" for r in rows for k, v in r.items() if k.endswith("_error")]
    return markdown_table([h for _, h in cols], body) + ("\n" + "\n".join(notes) + "\n" if notes else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    add_model_options(p, batch=8)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--attn", nargs="+", default=["laplacian", "softmax"], choices=["laplacian", "gaussian", "softmax"])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeats", type=int, default=20)
    p.add_argument("--compile", action=argparse.BooleanOptionalAction, default=True, help="also time torch.compile")
    add_autocast_option(p)
    add_output_options(p)
    args = p.parse_args(argv)
    suffix = f"_{args.autocast}" if args.autocast else ""
    stem = output_stem(args, "gpu_overhead", f"gpu_overhead_{args.device}{suffix}")
    rows = [measure(a, args) for a in args.attn]
    title = (f"# {args.model} inference at {args.size}², batch {args.batch}, {precision_name(args.autocast)} "
             f"({args.device}"
             f"{'; ' + torch.cuda.get_device_name() if args.device == 'cuda' else ''}; torch {torch.__version__})\n\n")
    text = title + table(rows)
    print(text)
    write_json(stem.with_suffix(".json"), rows, settings=vars(args))
    write_text(stem.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
