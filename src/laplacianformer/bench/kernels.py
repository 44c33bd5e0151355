"""Kernel benchmark: each primitive on the fast backend versus the naive reference and the torch.cdist
composite, forward and forward+backward, measured side by side in one process (DESIGN.md §6).

Cases (registry ``CASES``), on (B·H, N, d) = (2, N, 32) tensors against m = 49 landmarks:
    kernel      laplace_kernel(x, landmarks)            -> (2, N, 49)
    matmul      laplace_kernel_matmul(x, landmarks, v)  -> (2, N, 32)
    ns          Newton–Schulz inverse of (2, 49, 49) landmark matrices, 20 iterations (CUDA: Triton)
    attention   the whole laplacian_attention, B=1, H=2, d=32, m=49, default injective norm (the target)
Backends: "fast" (cpu on CPU, triton on CUDA), "composite", "naive" (kernel/matmul, N <= --naive-max-n).
For the attention case "composite" is the whole plain-PyTorch composite: torch.cdist kernels AND the
autograd normalisation (``backends.composite_operator``), i.e. the naive implementation the fast path replaces.

Backends are timed in interleaved rounds (one call of each per round) so that load changes hit them
alike; the speedup is the ratio of medians. Before a case is timed its result and gradients are compared with a float64 reference (the composite
for kernel/matmul/attention, the plain PyTorch solver for ns); a case whose check fails is still timed but
its speedup is reported as "refused". On CPU the attention case also gets its peak memory (fresh
subprocess per backend, bench.harness.peak_memory). The first call's time is kept (it includes
building the C loops or compiling the Triton kernels).

    python -m laplacianformer.bench.kernels                 # CPU (and CUDA when present), writes runs/bench/kernels/
    python -m laplacianformer.bench.kernels --publish       # the same into benchmarks/results/
    python -m laplacianformer.bench.kernels --quick         # seconds: small N, one repeat, no memory
    python -m laplacianformer.bench.kernels --cases attention --sizes 16384 --devices cpu   # the CPU target
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

import torch
from tqdm import tqdm

from .backends import composite_operator, kernel_backend
from .harness import op_call, peak_memory, round_robin
from .output import add_output_options, output_stem
from .report import markdown_table, plot_loglog, write_json, write_text
from ..ops import laplacian_attention
from ..ops.kernel import laplace_kernel, laplace_kernel_matmul
from ..ops.newton_schulz import regularised_inverse

CASES = ("kernel", "matmul", "ns", "attention")
M_LANDMARKS, D, HEADS = 49, 32, 2
CHECK_TOL = {"kernel": 1e-5, "matmul": 1e-5, "ns": 1e-4, "attention": 3e-3}


def _fast_name(device: str) -> str:
    return "triton" if device == "cuda" else "cpu"


def _inputs(case: str, n: int, device: str, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    if case == "attention":
        return [torch.randn(1, HEADS, n, D, generator=gen, dtype=dtype).to(device) for _ in range(3)]
    if case == "ns":
        x = torch.randn(HEADS, M_LANDMARKS, D, generator=gen, dtype=dtype) * D**-0.5
        return [torch.exp(-torch.cdist(x, x, p=1.0) / 4.0).to(device)]
    x = torch.randn(HEADS, n, D, generator=gen, dtype=dtype) * D**-0.5
    y = torch.randn(HEADS, M_LANDMARKS, D, generator=gen, dtype=dtype) * D**-0.5
    v = torch.randn(HEADS, M_LANDMARKS, D, generator=gen, dtype=dtype)
    return [x.to(device), y.to(device)] + ([v.to(device)] if case == "matmul" else [])


def _apply(case: str, args):
    if case == "kernel":
        return laplace_kernel(args[0], args[1], 4.0)
    if case == "matmul":
        return laplace_kernel_matmul(args[0], args[1], args[2], 4.0)
    if case == "ns":
        return regularised_inverse(args[0], iters=20, eps=0.01)
    side = int(round(args[0].shape[2] ** 0.5))
    return laplacian_attention(*args, hw=(side, side))


def _backend(case: str, name: str):
    """Kernel backend; the attention case's composite is the whole composite operator."""
    return composite_operator() if case == "attention" and name == "composite" else kernel_backend(name)


def make_call(case: str, backend_name: str, n: int, device: str, with_backward: bool, seed: int = 0,
              warm: bool = False):
    """A zero-argument callable running one case (also the peak-memory factory).

    ``warm=True`` first runs the case once at a small size, so lazy imports, the C build and Triton
    compilation do not count towards the measured call's memory.
    """
    if warm:
        make_call(case, backend_name, min(n, 256), device, with_backward, seed)()

    def run(*args):
        with _backend(case, backend_name):
            return _apply(case, args)

    return op_call(run, _inputs(case, n, device, seed=seed), with_backward)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-300)).item()


def check(case: str, backend_name: str, n: int, device: str) -> float:
    """Largest relative error of the output and every input gradient against the float64 reference."""
    inputs = _inputs(case, n, device)
    probe = torch.Generator().manual_seed(1)
    results = []
    for name, dtype in ((backend_name, torch.float32), ("composite", torch.float64)):
        args = [t.to(dtype).requires_grad_() for t in inputs]
        ctx = _backend(case, name) if case != "ns" or name != "composite" else contextlib.nullcontext()
        with ctx:
            if case == "ns" and name == "composite":
                out = regularised_inverse(args[0].cpu(), iters=20, eps=0.01)
            else:
                out = _apply(case, args)
        grad = torch.randn(out.shape, generator=probe, dtype=torch.float64).to(out.device, out.dtype)
        grads = torch.autograd.grad(out, args, grad)
        results.append([out.cpu(), *[g.cpu() for g in grads]])
        probe.manual_seed(1)
    return max(_rel(a, b) for a, b in zip(*results))


def run(args) -> list[dict]:
    rows = []
    devices = args.devices
    plan = []
    for device in devices:
        for case in args.cases:
            sizes = [M_LANDMARKS] if case == "ns" else args.sizes
            if case == "ns" and device == "cpu":
                continue
            for n in sizes:
                names = [_fast_name(device), "composite"]
                if case in ("kernel", "matmul") and n <= args.naive_max_n:
                    names.append("naive")
                plan.append((device, case, n, names))
    for device, case, n, names in tqdm(plan, desc="kernel benchmark", file=sys.stderr):
        errs = {name: check(case, name, min(n, args.check_max_n), device) for name in names}
        timings = {}
        for mode, bwd in (("fwd", False), ("fwd+bwd", True)):
            calls = {name: make_call(case, name, n, device, bwd) for name in names}
            timings.update({(name, mode): t for name, t in round_robin(calls, repeats=args.repeats, device=device).items()})
        for mode in ("fwd", "fwd+bwd"):
            base = timings[("composite", mode)].median_ms
            for name in names:
                t = timings[(name, mode)]
                ok = errs[name] < CHECK_TOL[case]
                rows.append(
                    {
                        "device": device, "case": case, "n": n, "backend": name, "mode": mode,
                        "median_ms": t.median_ms, "iqr_ms": t.iqr_ms, "min_ms": t.min_ms,
                        "first_call_ms": t.warmup_ms[0],
                        "check_rel_err": errs[name], "check_ok": ok,
                        "speedup_vs_composite": (base / t.median_ms) if ok else None,
                    }
                )
    if args.memory:
        n = max(args.sizes)
        for device in devices:
            if "attention" not in args.cases:
                continue
            for name in (_fast_name(device), "composite"):
                mem = peak_memory(
                    "laplacianformer.bench.kernels:make_call",
                    {"case": "attention", "backend_name": name, "n": n, "device": device, "with_backward": True,
                     "warm": True},
                    device=device,
                    timeout=600,
                    **({"threads": args.threads} if args.threads is not None else {}),
                )
                for row in rows:
                    if (row["device"], row["case"], row["n"], row["backend"], row["mode"]) == (
                        device, "attention", n, name, "fwd+bwd"
                    ):
                        row["peak_mb"] = mem["peak_mb"]
                        row["peak_method"] = mem["method"]
    return rows


def report(rows: list[dict], out: Path, settings: dict) -> None:
    header = ["device", "case", "N", "backend", "mode", "median ms", "IQR ms", "min ms", "first call ms", "check rel err",
              "speedup vs composite", "peak MiB"]
    table = []
    for r in rows:
        speed = f"{r['speedup_vs_composite']:.2f}x" if r["check_ok"] else "refused (check failed)"
        table.append([r["device"], r["case"], r["n"], r["backend"], r["mode"], r["median_ms"], r["iqr_ms"],
                      r["min_ms"], r["first_call_ms"], f"{r['check_rel_err']:.1e}", speed, r.get("peak_mb")])
    text = markdown_table(header, table)
    print(text)
    write_json(out.with_suffix(".json"), rows, settings=settings)
    write_text(out.with_suffix(".md"), f"Command: `python -m laplacianformer.bench.kernels {' '.join(sys.argv[1:])}`\n\n" + text)
    panels = []
    for case in ("kernel", "matmul", "attention"):
        series = {}
        for r in rows:
            if r["case"] == case and r["mode"] == "fwd+bwd":
                xs, ys = series.setdefault(f"{r['device']} {r['backend']}", ([], []))
                xs.append(r["n"])
                ys.append(r["median_ms"])
        if series:
            panels.append({"ylabel": "fwd+bwd ms (median)", "title": case, "series": series})
    if panels:
        plot_loglog(out.with_suffix(".png"), panels, xlabel="N tokens", title="Kernel primitives: fwd+bwd time")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[1024, 4096, 16384], help="N (perfect squares)")
    p.add_argument("--cases", nargs="+", choices=CASES, default=list(CASES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--naive-max-n", type=int, default=4096, help="largest N for the broadcasting reference")
    p.add_argument("--check-max-n", type=int, default=16384, help="largest N of the correctness check")
    p.add_argument("--memory", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--devices", nargs="+", choices=("cpu", "cuda"), default=None,
                   help="default: cpu, plus cuda when available")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's default)")
    p.add_argument("--quick", action="store_true", help="N = 256, 1024; one repeat; no memory")
    add_output_options(p)
    args = p.parse_args(argv)
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.sizes, args.repeats, args.memory = [256, 1024], 1, False
    for n in args.sizes:
        if int(round(n**0.5)) ** 2 != n:
            p.error(f"--sizes: expected perfect squares (2-D token grids), got {n}")
    if args.devices is None:
        args.devices = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])
    if "cuda" in args.devices and not torch.cuda.is_available():
        p.error("--devices: cuda requested but torch.cuda.is_available() is False")
    tag = "cuda" if "cuda" in args.devices else "cpu"
    out = output_stem(args, "kernels", f"kernels_{tag}")
    rows = run(args)
    report(rows, out, vars(args))


if __name__ == "__main__":
    main()
