"""torch.compile against eager: compile time and inference speed of whole models, and what the custom ops
would cost in eager mode.

    python -m laplacianformer.bench.compile                                  # micro and tiny at 224², CPU, inductor
    python -m laplacianformer.bench.compile --models laplacianformer_micro --size 64 --backend aot_eager --repeats 2

Models: ``torch.compile(model, fullgraph=True, backend=...)`` under the default runtime (no backend forced):
the kernel primitives and the solver enter the graph as the custom ops ``laplacianformer::laplace_kernel``,
``laplace_kernel_matmul`` and ``regularised_inverse`` (docs/DESIGN.md §6.5), so the compiled model runs the
same CPU fast paths as eager. "compile s" is the first call (tracing, code generation, one run); the speed is
the median of the later calls, inference under no_grad in eval mode, batch ``--batch``; "max |diff|" compares
the compiled output with eager.
Op overhead: ``laplacian_attention`` at one stage-1 shape, eager as it runs (the registry called directly)
against eager routed through the custom ops (``_runtime.graph_ops`` forced on), forward and forward+backward;
this is why eager calls skip the custom ops.
Writes runs/bench/compile/compile_<device>.{json,md}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
import contextlib
import time
from unittest import mock

import torch

from .harness import time_call
from .options import add_round_options, add_timing_options, start_timing_run, write_results
from .report import markdown_table, report_header, write_text
from ..models import create_model
from ..ops import _runtime, laplacian_attention


def model_rows(args) -> list[dict]:
    rows = []
    for name in args.models:
        torch.manual_seed(0)
        model = create_model(name).eval()
        x = torch.randn(args.batch, 3, args.size, args.size)
        torch._dynamo.reset()
        with torch.no_grad():
            ref = model(x)
            eager = time_call(lambda: model(x), warmup=1, repeats=args.repeats, max_seconds=args.max_seconds)
            compiled = torch.compile(model, fullgraph=True, backend=args.backend)
            t0 = time.perf_counter()
            out = compiled(x)
            compile_s = time.perf_counter() - t0
            fast = time_call(lambda: compiled(x), warmup=1, repeats=args.repeats, max_seconds=args.max_seconds)
        diff = float((out - ref).abs().max())
        rows.append(dict(model=name, size=args.size, batch=args.batch, backend=args.backend, compile_s=compile_s,
                         eager_ms=eager.median_ms, eager_iqr_ms=eager.iqr_ms, compiled_ms=fast.median_ms,
                         compiled_iqr_ms=fast.iqr_ms, speedup=eager.median_ms / fast.median_ms, max_abs_diff=diff))
        print(rows[-1], flush=True)
    return rows


@contextlib.contextmanager
def _through_custom_ops(on: bool):
    if not on:
        yield
        return
    with mock.patch.object(_runtime, "graph_ops", lambda: True):
        yield


def overhead_rows(args) -> list[dict]:
    torch.manual_seed(0)
    n_side, heads, d = args.op_side, 1, 32
    q, k, v = (torch.randn(args.batch, heads, n_side * n_side, d, requires_grad=True) for _ in range(3))
    kwargs = dict(hw=(n_side, n_side), landmarks=(7, 7))
    rows = []
    for mode in ("forward", "forward+backward"):
        res = {}
        for routed in (False, True):
            def call():
                with _through_custom_ops(routed):
                    if mode == "forward":
                        with torch.no_grad():
                            return laplacian_attention(q, k, v, **kwargs)
                    out = laplacian_attention(q, k, v, **kwargs)
                    return torch.autograd.grad(out.sum(), (q, k, v))

            res[routed] = time_call(call, warmup=2, repeats=args.op_repeats)
        rows.append(dict(mode=mode, tokens=n_side * n_side, eager_ms=res[False].median_ms,
                         custom_op_ms=res[True].median_ms, overhead=res[True].median_ms / res[False].median_ms - 1))
        print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=["laplacianformer_micro", "laplacianformer_tiny"])
    p.add_argument("--size", type=int, default=224)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--backend", default="inductor", help="torch.compile backend (inductor, aot_eager, ...)")
    add_round_options(p, repeats=10, max_seconds=60.0, per="measurement")
    p.add_argument("--op-side", type=int, default=56, help="token grid side of the op-overhead case")
    p.add_argument("--op-repeats", type=int, default=20)
    add_timing_options(p)
    args = p.parse_args(argv)
    load_before = start_timing_run(args, "laplacianformer.bench.compile", argv)
    rows = model_rows(args)
    overhead = overhead_rows(args)
    stem, load = write_results(args, "compile", load_before, dict(models=rows, op_overhead=overhead))
    table = markdown_table(
        ["model", "size", "batch", "backend", "compile s", "eager ms", "compiled ms", "speed-up", "max |diff|"],
        [[r["model"], r["size"], r["batch"], r["backend"], r["compile_s"], r["eager_ms"], r["compiled_ms"],
          r["speedup"], r["max_abs_diff"]] for r in rows],
    )
    table += "\nEager `laplacian_attention` (1 head, d = 32, 7×7 landmarks), registry called directly vs through the custom ops:\n\n"
    table += markdown_table(
        ["mode", "tokens", "eager ms", "through custom ops ms", "overhead"],
        [[r["mode"], r["tokens"], r["eager_ms"], r["custom_op_ms"], f"{100 * r['overhead']:+.1f}%"] for r in overhead],
    )
    header = report_header("torch.compile vs eager", args, load)
    write_text(stem.with_suffix(".md"), header + table)
    print(header + table)


if __name__ == "__main__":
    main()
