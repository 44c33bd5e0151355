"""Normalisation benchmark: the fused injective / inline normalisation ("fused": ``normalize_nystrom`` with
automatic backend selection, i.e. the C backend on CPU; docs/KERNELS.md) versus the autograd composite ``normalize_nystrom_reference``, forward and forward+backward, interleaved in one
process (DESIGN.md §4).

Inputs per case: C_q and B of shape (1, 2, N, 49) and V of shape (1, 2, N, 32), float32, as in the
default attention (B=1, H=2, m=49, d=32).  Before timing, the fused output and gradients are compared
with the composite in float64.  Rows with norm "attention:<norm>" time the whole
``laplacian_attention`` (B=1, H=2, d=32, 7×7 landmarks, the fast kernel backend) with the fused or the
composite normalisation swapped in, i.e. the end-to-end effect of the fused function.

Case "operator" times the whole default operator (``laplacian_attention``, norm "injective") against
``norm="none"`` and the SOFT baseline (``baselines.soft``), forward + backward, interleaved, at the shapes of
``OPERATOR_SHAPES`` (N = 16384 with B 1, H 2, d 32; Tiny's stage 1 at 224², 56² tokens, B 1, H 1, d 64):
the cost of the injective normalisation within the operator (docs/DESIGN.md §4).

    python -m laplacianformer.bench.normalization --threads 1     # runs/bench/normalization/normalization_cpu.*
    python -m laplacianformer.bench.normalization --sizes 16384 --repeats 7 --threads 1
    python -m laplacianformer.bench.normalization --cases operator --threads 2 --retain-heap   # ..._operator_cpu_retain.*
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .backends import composite_normalization
from .harness import op_call, round_robin
from .options import add_timing_options, results_stem, start_timing_run
from .report import markdown_table, plot_loglog, write_json, write_text
from ..ops import laplacian_attention, use
from ..baselines.soft import soft_attention
from ..ops.normalization import normalize_nystrom, normalize_nystrom_reference

M_LANDMARKS, E, HEADS = 49, 32, 2
IMPLS = {"fused": normalize_nystrom, "composite": normalize_nystrom_reference}
OPERATOR_SHAPES = {  # label: (B, H, grid side, d)
    "N=16384 (128²), B1 H2 d32": (1, 2, 128, 32),
    "Tiny stage 1 (56²), B1 H1 d64": (1, 1, 56, 64),
}
OPERATOR_VARIANTS = ("injective", "injective:fused", "none", "soft")
"""The default operator (its normalisation on the first backend that serves: C on CPU), the same with the
PyTorch ``fused`` backend forced (the default before the C backend), ``norm="none"``, SOFT."""


def _inputs(n: int, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    c = torch.rand(1, HEADS, n, M_LANDMARKS, generator=gen, dtype=dtype)
    b = torch.randn(1, HEADS, n, M_LANDMARKS, generator=gen, dtype=dtype)
    v = torch.randn(1, HEADS, n, E, generator=gen, dtype=dtype)
    return [c, b, v]


def make_call(impl: str, norm: str, n: int, with_backward: bool):
    """A zero-argument callable running one normalisation (forward, and backward with ones)."""
    return op_call(lambda c, b, v: IMPLS[impl](c, b, v, norm), _inputs(n), with_backward)


def make_attention_call(impl: str, norm: str, n: int, with_backward: bool):
    """laplacian_attention (fast kernel backend) with the ``impl`` normalisation swapped in."""
    gen = torch.Generator().manual_seed(0)
    side = int(round(n**0.5))

    def run(q, k, v):
        with contextlib.nullcontext() if impl == "fused" else composite_normalization():
            return laplacian_attention(q, k, v, hw=(side, side), norm=norm)

    return op_call(run, [torch.randn(1, HEADS, n, E, generator=gen) for _ in range(3)], with_backward)


def make_operator_call(variant: str, shape: tuple[int, int, int, int]):
    """Forward + backward of one of ``OPERATOR_VARIANTS`` ("norm[:normalization backend]" or "soft") on (B, H, side², d)
    random q, k, v (SOFT ties k to q), 7×7 landmarks, with a fixed random output gradient."""
    b, h, side, d = shape
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(b, h, side * side, d, generator=gen).requires_grad_() for _ in range(3))
    probe = torch.randn(b, h, side * side, d, generator=gen)
    leaves = (q, v) if variant == "soft" else (q, k, v)

    norm, _, backend = variant.partition(":")

    def call():
        if variant == "soft":
            out = soft_attention(q, v, hw=(side, side))
        else:
            with use(normalization=backend or "auto"):
                out = laplacian_attention(q, k, v, hw=(side, side), norm=norm)
        torch.autograd.grad(out, leaves, probe)
        return out

    return call


def run_operator(args) -> list[dict]:
    rows = []
    for label, shape in OPERATOR_SHAPES.items():
        calls = {variant: make_operator_call(variant, shape) for variant in OPERATOR_VARIANTS}
        timings = round_robin(calls, repeats=args.repeats)
        for variant, t in timings.items():
            rows.append({
                "shape": label, "variant": variant, "median_ms": t.median_ms, "iqr_ms": t.iqr_ms, "min_ms": t.min_ms,
                "vs_none": t.median_ms / timings["none"].median_ms, "vs_soft": t.median_ms / timings["soft"].median_ms,
            })
    return rows


def check(norm: str, n: int) -> float:
    """Largest relative error of the fused output and gradients against the float64 composite."""
    inputs = _inputs(n)
    probe = torch.randn(1, HEADS, n, E, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = []
    for impl, dtype in (("fused", torch.float32), ("composite", torch.float64)):
        args = [t.to(dtype).requires_grad_() for t in inputs]
        out = IMPLS[impl](*args, norm)
        grads = torch.autograd.grad(out, args, probe.to(dtype))
        results.append([out.double(), *[g.double() for g in grads]])
    return max(((a - b).norm() / b.norm()).item() for a, b in zip(*results))


def run(args) -> list[dict]:
    rows = []
    plan = [(case, norm, n) for case in ("normalize", "attention") if case in args.cases
            for norm in args.norms for n in args.sizes]
    for case, norm, n in tqdm(plan, desc="normalisation benchmark", file=sys.stderr):
        err = check(norm, min(n, 4096))
        factory = make_call if case == "normalize" else make_attention_call
        label = norm if case == "normalize" else f"attention:{norm}"
        for mode, bwd in (("fwd", False), ("fwd+bwd", True)):
            calls = {impl: factory(impl, norm, n, bwd) for impl in IMPLS}
            timings = round_robin(calls, repeats=args.repeats)
            for impl, t in timings.items():
                rows.append(
                    {
                        "norm": label, "n": n, "impl": impl, "mode": mode, "median_ms": t.median_ms,
                        "iqr_ms": t.iqr_ms, "min_ms": t.min_ms, "check_rel_err": err,
                        "speedup_vs_composite": timings["composite"].median_ms / t.median_ms,
                    }
                )
    return rows


def report(rows: list[dict], out: Path, settings: dict, operator: list[dict] | None = None) -> None:
    header = ["norm", "N", "impl", "mode", "median ms", "IQR ms", "min ms", "check rel err (fp32 vs fp64)",
              "speedup vs composite"]
    table = [[r["norm"], r["n"], r["impl"], r["mode"], r["median_ms"], r["iqr_ms"], r["min_ms"],
              f"{r['check_rel_err']:.1e}", f"{r['speedup_vs_composite']:.2f}x"] for r in rows]
    text = f"Command: `{settings['command']}` (allocator {settings['allocator']}, {settings['threads_used']} threads)\n\n"
    if rows:
        text += markdown_table(header, table) + "\n"
    operator = operator or []
    if operator:
        text += "Whole operator, forward + backward (interleaved rounds, medians):\n\n" + markdown_table(
            ["shape", "variant", "median ms", "IQR ms", "min ms", "vs none", "vs SOFT"],
            [[r["shape"], r["variant"], r["median_ms"], r["iqr_ms"], r["min_ms"], f"{r['vs_none']:.2f}x",
              f"{r['vs_soft']:.2f}x"] for r in operator]) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out.with_suffix(".md"), text)
    write_json(out.with_suffix(".json"), {"rows": rows, "operator": operator}, settings=settings)
    if not rows:
        return
    panels = []
    for norm in sorted({r["norm"] for r in rows}):
        series = {}
        for r in rows:
            if r["norm"] == norm:
                xs, ys = series.setdefault(f"{r['impl']} {r['mode']}", ([], []))
                xs.append(r["n"])
                ys.append(r["median_ms"])
        panels.append({"ylabel": "median ms", "title": f"norm={norm}", "series": series})
    plot_loglog(out.with_suffix(".png"), panels, xlabel="N (tokens)", title="normalize_nystrom, B·H=2, m=49, e=32")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384])
    p.add_argument("--norms", nargs="+", choices=("injective", "inline"), default=["injective", "inline"])
    p.add_argument("--cases", nargs="+", choices=("normalize", "attention", "operator"),
                   default=["normalize", "attention"])
    p.add_argument("--repeats", type=int, default=7)
    add_timing_options(p)
    args = p.parse_args(argv)
    start_timing_run(args, "laplacianformer.bench.normalization", argv)
    stem = "normalization" if args.cases != ["operator"] else "normalization_operator"
    out = results_stem(args, stem)
    settings = {"command": "python -m laplacianformer.bench.normalization " + " ".join(sys.argv[1:]), **vars(args),
                "threads_used": torch.get_num_threads()}
    operator = run_operator(args) if "operator" in args.cases else []
    report(run(args), out, settings, operator)


if __name__ == "__main__":
    main()
