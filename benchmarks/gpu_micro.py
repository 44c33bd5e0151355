"""Micro-benchmarks of single ops at the model's shapes: the Newton–Schulz solve of many 49×49 matrices (time
and agreement with float64) and one kernel matrix C = k(X, L) at the Tiny backbone's stage-1 shape.

    python -m benchmarks.gpu_micro --device cuda          # 64 and 132 matrices; G·N = 131,072, d 64
    python -m benchmarks.gpu_micro --device cpu --ns-matrices 4 8 --kernel-groups 2 --kernel-tokens 256 \
        --kernel-dim 16 --repeats 2                                   # seconds (smoke run)

Repository only (not in the wheel): run from the checkout's root.

Cases, each timed forward only, inputs float32 on ``--device``:

- ``ns``: ``newton_schulz_iterate`` (the op ``newton_schulz``: the Triton kernel on CUDA, the C loop on the
  CPU; docs/DESIGN.md §3) of G symmetric positive definite m×m matrices (``--ns-matrices``, default 64 — the
  Tiny backbone's last stage at batch 8 — and 132, one per H100 SM), ``--ns-iters`` steps, condition numbers
  log-spaced from 1 to ``--ns-cond`` across the batch; and the largest relative (Frobenius) difference of a
  matrix from the same iteration in float64.
- ``kernel``: ``laplace_kernel(x (G, N, d), L (G, m, d))`` -> (G, N, m) (docs/DESIGN.md §2), default G = 8,
  N = 16384 (G·N = 131,072: Tiny's stage 1 at 512², batch 8), d = 64, m = 49; its relative error against the
  float64 composite.

Time: on CUDA the median of ``--repeats`` calls between CUDA events (``harness.cuda_event_times``: the
launch and the kernel, no host synchronisation inside), on the CPU the wall-clock median
(``harness.time_call``). The backend that served each case is recorded (``ops.explain``). Writes
runs/bench/gpu_micro/gpu_micro_<device>.{json,md}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
import sys

import torch

from laplacianformer.bench.backends import kernel_backend
from laplacianformer.bench.harness import cuda_event_times, time_call
from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.bench.report import markdown_table, write_json, write_text
from laplacianformer.ops import explain, laplace_kernel
from laplacianformer.ops.newton_schulz import newton_schulz_iterate

LAM = 4.0


def spd_matrices(count: int, m: int, max_cond: float, seed: int = 0) -> torch.Tensor:
    """(count, m, m) float64 symmetric positive definite matrices, matrix i with eigenvalues log-spaced from 1
    down to 1/cond_i, the cond_i log-spaced from 1 to ``max_cond`` across the batch."""
    gen = torch.Generator().manual_seed(seed)
    conds = torch.logspace(0, torch.log10(torch.tensor(float(max_cond))).item(), count, dtype=torch.float64)
    q, _ = torch.linalg.qr(torch.randn(count, m, m, generator=gen, dtype=torch.float64))
    lam = torch.stack([torch.logspace(0, -torch.log10(c).item(), m, dtype=torch.float64) for c in conds])
    return (q * lam[:, None, :]) @ q.transpose(-1, -2)


def _median_us(fn, device: str, repeats: int) -> tuple[float, float]:
    """(median, min) microseconds of one call of ``fn``: CUDA events on CUDA, wall clock elsewhere."""
    if torch.device(device).type == "cuda":
        times = sorted(cuda_event_times(fn, repeats))
        return times[len(times) // 2] * 1e3, times[0] * 1e3
    t = time_call(fn, device=device, warmup=1, repeats=repeats)
    return t.median_ms * 1e3, t.min_ms * 1e3


def _rel(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Relative Frobenius difference over the last two dimensions (float64)."""
    a, b = a.double().cpu(), b.double().cpu()
    return torch.linalg.matrix_norm(a - b) / torch.linalg.matrix_norm(b).clamp_min(1e-300)


def _served_by(op: str, *inputs) -> str:
    """The backend ``op`` runs for ``inputs`` (the name in the first line of ``ops.explain``)."""
    first = explain(op, *inputs).splitlines()[0]
    return first.split(" runs ", 1)[1].strip("'") if " runs " in first else first


def ns_row(count: int, m: int, iters: int, max_cond: float, device: str, repeats: int) -> dict:
    """Time and float64 agreement of the Newton–Schulz solve of ``count`` m×m matrices (case ``ns``)."""
    p64 = spd_matrices(count, m, max_cond)
    p = p64.float().to(device)
    with torch.no_grad():
        got = newton_schulz_iterate(p, iters)
        want = newton_schulz_iterate(p.double().cpu(), iters)  # the same iteration on the same values, float64
        median_us, min_us = _median_us(lambda: newton_schulz_iterate(p, iters), device, repeats)
    return dict(case="ns", device=device, matrices=count, m=m, iters=iters, max_cond=max_cond,
                median_us=median_us, min_us=min_us, max_rel_err_vs_float64=_rel(got, want).max().item(),
                backend=_served_by("newton_schulz", p, iters, None, True))


def kernel_row(groups: int, tokens: int, dim: int, m: int, device: str, repeats: int) -> dict:
    """Time and float64 error of one kernel matrix C = k(X, L), X (groups, tokens, dim) (case ``kernel``)."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(groups, tokens, dim, generator=gen) * dim**-0.5).to(device)
    y = (torch.randn(groups, m, dim, generator=gen) * dim**-0.5).to(device)
    with torch.no_grad():
        got = laplace_kernel(x, y, LAM)
        with kernel_backend("composite"):
            want = laplace_kernel(x.double(), y.double(), LAM)
        err = ((got.double() - want).norm() / want.norm()).item()
        median_us, min_us = _median_us(lambda: laplace_kernel(x, y, LAM), device, repeats)
    return dict(case="kernel", device=device, groups=groups, tokens=tokens, group_tokens=groups * tokens, d=dim, m=m,
                median_us=median_us, min_us=min_us, rel_err_vs_float64=err,
                backend=_served_by("kernel", x, y, LAM, "laplacian"))


def report(rows: list[dict], args) -> str:
    timing = "CUDA events" if torch.device(args.device).type == "cuda" else "wall clock"
    ns = [r for r in rows if r["case"] == "ns"]
    kern = [r for r in rows if r["case"] == "kernel"]
    text = f"# Single ops at the model's shapes ({args.device}; median of {args.repeats}, {timing})\n\n"
    if ns:
        text += markdown_table(
            ["Newton–Schulz: matrices", "m", "iterations", "condition up to", "median µs", "min µs",
             "max rel. diff. from float64", "backend"],
            [[r["matrices"], r["m"], r["iters"], r["max_cond"], r["median_us"], r["min_us"],
              f"{r['max_rel_err_vs_float64']:.2e}", r["backend"]] for r in ns]) + "\n"
    if kern:
        text += markdown_table(
            ["kernel matrix: G", "N", "G·N", "d", "m", "median µs", "min µs", "rel. error", "backend"],
            [[r["groups"], r["tokens"], r["group_tokens"], r["d"], r["m"], r["median_us"], r["min_us"],
              f"{r['rel_err_vs_float64']:.2e}", r["backend"]] for r in kern])
    return text


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--cases", nargs="+", choices=("ns", "kernel"), default=["ns", "kernel"])
    p.add_argument("--ns-matrices", type=int, nargs="+", default=[64, 132], help="batch sizes of the solve")
    p.add_argument("--ns-m", type=int, default=49, help="matrix size (landmarks)")
    p.add_argument("--ns-iters", type=int, default=20)
    p.add_argument("--ns-cond", type=float, default=1e3, help="largest condition number in the batch")
    p.add_argument("--kernel-groups", type=int, default=8, help="G: batch × heads")
    p.add_argument("--kernel-tokens", type=int, default=16384, help="N tokens per group")
    p.add_argument("--kernel-dim", type=int, default=64, help="d, the head width")
    p.add_argument("--kernel-m", type=int, default=49, help="landmarks")
    p.add_argument("--repeats", type=int, default=50)
    add_output_options(p)
    args = p.parse_args(argv)
    for name in ("ns_m", "ns_iters", "kernel_groups", "kernel_tokens", "kernel_dim", "kernel_m", "repeats"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')}: expected a positive integer, got {getattr(args, name)}")
    if min(args.ns_matrices) < 1:
        p.error(f"--ns-matrices: expected positive integers, got {args.ns_matrices}")
    if args.ns_cond < 1:
        p.error(f"--ns-cond: expected a condition number >= 1, got {args.ns_cond:g}")
    if torch.device(args.device).type == "cuda" and not torch.cuda.is_available():
        p.error("--device: cuda requested but torch.cuda.is_available() is False")
    stem = output_stem(args, "gpu_micro", f"gpu_micro_{torch.device(args.device).type}")
    rows = []
    if "ns" in args.cases:
        rows += [ns_row(g, args.ns_m, args.ns_iters, args.ns_cond, args.device, args.repeats) for g in args.ns_matrices]
    if "kernel" in args.cases:
        rows.append(kernel_row(args.kernel_groups, args.kernel_tokens, args.kernel_dim, args.kernel_m, args.device,
                               args.repeats))
    text = report(rows, args)
    print(text)
    write_json(stem.with_suffix(".json"), rows, settings=vars(args))
    write_text(stem.with_suffix(".md"), text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
