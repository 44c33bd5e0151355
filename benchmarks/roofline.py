"""Roofline estimate of the Triton kernels at the model's default shapes, and (on CUDA) measured vs estimated.

    python -m benchmarks.roofline --write      # the estimate table: runs/bench/roofline/roofline_h100.*
    python -m benchmarks.roofline --write --publish  # the same into benchmarks/results/
    python -m benchmarks.roofline --measure    # on a GPU: time each case, measured vs estimated (JSON)

Repository only (not in the wheel): run from the checkout's root.

Shapes: ``laplacianformer_tiny`` (head dim 64 in every stage, heads 1/2/5/8, token grids at stride 4, 8,
16, 32), batch 8, m = 49 landmarks (7 × 7), Newton–Schulz 20 steps, at 224² and 1024² inputs; float32.
Stage 4 at 224² has 49 tokens (the landmarks cover every token: the exact kernel, N = M = 49).

Counting (per call):
- bytes: HBM traffic, every input read once and every output written once (the tiles' re-reads are
  assumed to hit L1/L2; the dY/dV workspaces of the backward count as written and read once);
- operations: FP32 instructions on the CUDA cores, one per sub, |.|-add (the abs is an operand modifier),
  multiply or FMA: L1 distance 2 per (n, m, k), squared L2 2; the backward's sign-weighted sums 3 per
  (n, m, k) for dX and 3 for dY; products with V as FMAs (IEEE float32 in the Triton kernels: CUDA cores);
  Newton–Schulz for m <= 64 (the on-chip kernel, ops/newton_schulz/triton.py): two products of the
  padded block (BM = 64 for m = 49) per step as "tf32x3" tensor-core products, 3 · 2·BM³ TF32 FLOPs each
  (``ns_tensor``), rated at the TF32 tensor peak; the implicit backward likewise (two products); m > 64
  (the tiled kernel): 2·m_pad³ FMAs per step on CUDA cores;
- time = max(bytes / bandwidth, operations / rate); Newton–Schulz runs one CTA per matrix,
  so its compute rate is that of min(matrices, SMs) SMs.
``ns_prediction`` (``--ns-prediction``) spells out the Newton–Schulz forward's prediction for one shape: the
compute floor above and a latency estimate of the chunked products (per step 2·BM/16 rounds of an L1 read
and the warps' mma.sync issue, two CTA barriers).

Assumed H100 SXM5 peaks (NVIDIA data sheet): HBM3 3.35 TB/s; FP32 67 TFLOP/s = 33.5 T FP32 instructions/s
(132 SMs × 128 lanes × 1.98 GHz, an FMA counting as one instruction); TF32 tensor 495 TFLOP/s and BF16
989 TFLOP/s dense (not used: the distance has no tensor-core form and the products run IEEE float32).
An H200 has the same SMs and 4.8 TB/s HBM3e: memory-bound rows are then 1.43x faster.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.bench.report import write_text

PEAK = {
    "name": "H100 SXM5",
    "hbm_bytes_per_s": 3.35e12,
    "fp32_instr_per_s": 33.5e12,
    "sms": 132,
    "tf32_tensor_flops": 495e12,
    "bf16_tensor_flops": 989e12,
}
HEADS = (1, 2, 5, 8)
HEAD_DIM = 64
STRIDES = (4, 8, 16, 32)
BATCH = 8
M = 49
ITERS = 20
F32 = 4


def _pad(m: int, tile: int = 32) -> int:
    return math.ceil(m / tile) * tile


ONCHIP_MAX_M = 64  # ops/newton_schulz/triton.py: on chip (tf32x3 tensor-core products) up to here


def _ns_block(m: int) -> int:
    return max(16, 2 ** math.ceil(math.log2(m)))


def ns_tensor_flops(m: int, products: int) -> int:
    """TF32 tensor FLOPs of ``products`` "tf32x3" products of the padded (BM, BM) block: 3 · 2·BM³ each."""
    return products * 3 * 2 * _ns_block(m) ** 3


def ns_prediction(matrices: int = 64, m: int = 49, iters: int = ITERS, peak: dict = PEAK, clock_hz: float = 1.98e9,
                  round_cycles: int = 300, barrier_cycles: int = 50) -> dict:
    """The on-chip Newton–Schulz forward's predicted time for ``matrices`` (m, m) matrices in one launch (one CTA
    per matrix, each on its own SM while matrices <= SMs). ``compute_us``: the TF32 tensor FLOPs of the padded
    products at one SM's share of the tensor peak; ``latency_us``: per step 2·BM/16 chunk rounds of
    ``round_cycles`` (an L1 read of two 16-wide operand chunks, ~40 cycles, and 3 · (BM/16)² · 2 mma.sync
    m16n8k8 per round spread over the 8 warps; ~300 cycles assumed) and two barriers. A prediction, not a
    measurement."""
    bm = _ns_block(m)
    useful = iters * 2 * 2 * m ** 3 * matrices
    executed = iters * ns_tensor_flops(m, 2) * matrices
    sms = min(matrices, peak["sms"])
    waves = math.ceil(matrices / peak["sms"])
    compute_us = executed / (peak["tf32_tensor_flops"] * sms / peak["sms"]) * 1e6
    rounds = iters * 2 * (bm // 16)
    latency_us = waves * (rounds * round_cycles + iters * 2 * barrier_cycles) / clock_hz * 1e6
    return dict(matrices=matrices, m=m, block=bm, iters=iters, useful_flops=useful, executed_tensor_flops=executed,
                compute_us=round(compute_us, 1), latency_us=round(latency_us, 1),
                predicted_us=round(max(compute_us, latency_us), 1))


def cases(batch: int = BATCH) -> list[dict]:
    """One dict per (resolution, stage, kernel): shape, bytes, ops, estimated microseconds."""
    rows = []
    for res in (224, 1024):
        for stage, (heads, stride) in enumerate(zip(HEADS, STRIDES), start=1):
            n = (res // stride) ** 2
            m = min(M, n)
            g = batch * heads
            d = HEAD_DIM
            shape = dict(res=res, stage=stage, batch_heads=g, n=n, m=m, d=d)
            c_bytes = g * n * m * F32
            io = g * (n + m) * d * F32
            rows.append(dict(shape, kernel="kernel_fwd", bytes=io + c_bytes, ops=2 * g * n * m * d))
            # dX and dY: read x, y, dC, C; write dX, the dY workspace (16 splits) and read it back
            rows.append(dict(shape, kernel="kernel_bwd", bytes=io + 2 * c_bytes + io + 2 * 16 * g * m * d * F32,
                             ops=2 * (2 + 3) * g * n * m * d))
            if m <= ONCHIP_MAX_M:
                rows.append(dict(shape, kernel="ns_fwd", bytes=2 * g * m * m * F32,
                                 ops=ITERS * g * ns_tensor_flops(m, 2), ctas=g, rate="tf32_tensor_flops"))
                rows.append(dict(shape, kernel="ns_grad", bytes=3 * g * m * m * F32, ops=g * ns_tensor_flops(m, 2),
                                 ctas=g, rate="tf32_tensor_flops"))
            else:
                mp = _pad(m, 64)
                rows.append(dict(shape, kernel="ns_fwd", bytes=2 * g * m * m * F32, ops=ITERS * 2 * g * mp ** 3,
                                 ctas=g))
                rows.append(dict(shape, kernel="ns_grad", bytes=3 * g * m * m * F32, ops=2 * g * mp ** 3, ctas=g))
    rows += fused_cases(batch)
    for r in rows:
        t_mem = r["bytes"] / PEAK["hbm_bytes_per_s"]
        sms = min(r.get("ctas", PEAK["sms"]), PEAK["sms"])
        t_ops = r["ops"] / (PEAK[r.get("rate", "fp32_instr_per_s")] * sms / PEAK["sms"])
        r["ops_per_byte"] = round(r["ops"] / r["bytes"], 2)
        r["bound"] = "compute" if t_ops >= t_mem else "memory"
        r["est_us"] = round(max(t_mem, t_ops) * 1e6, 2)
        if "compiled_ops" in r:  # the same roofline with the distance loop's instructions as compiled
            r["est_compiled_us"] = round(max(t_mem, r["compiled_ops"] / PEAK["fp32_instr_per_s"]) * 1e6, 2)
    return rows


COMPILED_PER_TRIPLE = 2.89
"""SASS instructions per (row, landmark column, feature) of the streaming passes' distance loop as compiled for
m <= 64 (benchmarks/triton_aot.py on sm_80 and sm_90; docs/KERNELS.md, "The distance loop"), over the
landmark columns padded to a power of two (64 for m = 49): the "as compiled" estimate of ``fused_cases``."""


def _compiled_distance(ops: int, evaluations: int, g: int, n: int, m: int, d: int) -> int:
    """``ops`` with its ``evaluations`` kernel-row recomputations counted as compiled (``COMPILED_PER_TRIPLE``
    over the padded columns) instead of 2 per real (row, landmark, feature)."""
    block_m = max(16, 1 << (m - 1).bit_length())
    return round(ops + evaluations * g * n * d * (COMPILED_PER_TRIPLE * block_m - 2 * m))


def fused_cases(batch: int = BATCH) -> list[dict]:
    """The fused path's kernels (docs/KERNELS.md, "The streaming passes", "The fused landmark solve", "The fused
    backward") at the model's default (K ≠ Q, the injective normalisation, DWConv(V) fused), per Nyström stage
    (m < N), counted as the table above counts: q, k, v, G and the outputs read or written once each (the
    kernel rows are recomputed, never stored; the workspaces of m×m and m×e partials are small and omitted);
    a recomputed kernel row 2 instructions per (row, landmark, feature), a kernel derivative 3 for dx and 3 for
    dL, the IEEE m×m row products (S' k̃ᵀ, k̃ (S' + S'ᵀ), the dS' sum, (C_q − c̄) q_cov) one FMA per (row, m, m);
    the "tf32x3" row products (Gram, M', output, dM, dv) on tensor cores, 3 · 2 per multiply-add, at the TF32 rate,
    which leaves them far below the CUDA-core terms: not counted. The landmark solve's pooling and W, and pass
    C's nine m×m products per group, are counted at one CTA per group like the solver. The passes whose kernel
    rows run the register-blocked loop also get ``compiled_ops`` (``_compiled_distance``: the loop's
    instructions as compiled, over the padded landmark columns) and an "as compiled" estimate."""
    rows = []
    for res in (224, 1024):
        for stage, (heads, stride) in enumerate(zip(HEADS, STRIDES), start=1):
            n = (res // stride) ** 2
            if n <= M:
                continue  # the landmarks cover every token: the exact kernel's step path
            g, m, d = batch * heads, M, HEAD_DIM
            e = d
            shape = dict(res=res, stage=stage, batch_heads=g, n=n, m=m, d=d)
            row = lambda f: g * n * f * F32  # noqa: E731  bytes of f floats per row and group
            dist = 2 * g * n * m * d
            mm = g * n * m * m
            rows += [
                dict(shape, kernel="landmark_solve", bytes=row(d) + g * (m * d + 2 * m * m) * F32,
                     ops=ITERS * g * ns_tensor_flops(m, 2), ctas=g, rate="tf32_tensor_flops"),
                dict(shape, kernel="stream_query", bytes=row(2 * d), ops=2 * dist,
                     compiled_ops=_compiled_distance(2 * dist, 2, g, n, m, d)),
                dict(shape, kernel="stream_key", bytes=row(d + e), ops=dist + mm,
                     compiled_ops=_compiled_distance(dist + mm, 1, g, n, m, d)),
                dict(shape, kernel="stream_out", bytes=row(d + e + e), ops=dist + 9 * g * n * e,
                     compiled_ops=_compiled_distance(dist + 9 * g * n * e, 1, g, n, m, d)),
                dict(shape, kernel="bwd_query", bytes=row(d + 2 * e), ops=dist + 9 * g * n * e,
                     compiled_ops=_compiled_distance(dist + 9 * g * n * e, 1, g, n, m, d)),
                dict(shape, kernel="bwd_key", bytes=row(d + e), ops=dist + 2 * mm,
                     compiled_ops=_compiled_distance(dist + 2 * mm, 1, g, n, m, d)),
                dict(shape, kernel="bwd_landmark_grad", bytes=g * 12 * m * m * F32, ops=g * 9 * _ns_block(m) ** 3,
                     ctas=g),
                dict(shape, kernel="bwd_rows", bytes=row(2 * d + 2 * e) + row(2 * d + e),
                     ops=2 * dist + 2 * 2 * 3 * g * n * m * d + 2 * mm + 9 * g * n * e),
                dict(shape, kernel="bwd_pool_grad", bytes=row(2 * d), ops=g * n * m * d),
            ]
    return rows


HEADER = ["res", "stage", "B·H", "N", "m", "d", "kernel", "MB moved", "G ops", "ops/byte", "bound", "est. µs",
          "est. µs as compiled"]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    for r in rows:
        cells = [r["res"], r["stage"], r["batch_heads"], r["n"], r["m"], r["d"], r["kernel"],
                 f"{r['bytes'] / 1e6:.2f}", f"{r['ops'] / 1e9:.3f}", r["ops_per_byte"], r["bound"], r["est_us"],
                 r.get("est_compiled_us", "")]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


def write(stem: Path) -> None:
    """The estimate table as ``stem``.json and .md."""
    rows = cases()
    write_text(stem.with_suffix(".json"), json.dumps({"peak": PEAK, "batch": BATCH, "iters": ITERS, "rows": rows},
                                                     indent=1) + "\n")
    write_text(stem.with_suffix(".md"), table(rows) + "\n")
    print(table(rows))


TIMED = ("kernel_fwd", "kernel_bwd", "ns_fwd", "ns_grad")
"""The rows ``--measure`` times kernel by kernel (``_run_case``)."""


def _run_case(r: dict, device: str):
    """A callable running the Triton kernel(s) of row ``r`` once, and its inputs (float32 on ``device``)."""
    import torch

    from laplacianformer.ops.kernel.triton import laplace_kernel_bwd, laplace_kernel_fwd
    from laplacianformer.ops.newton_schulz.triton import implicit_grad, newton_schulz_fwd

    gen = torch.Generator(device="cpu").manual_seed(0)
    g, n, m, d = r["batch_heads"], r["n"], r["m"], r["d"]
    x = (torch.randn(g, n, d, generator=gen) * 0.3).to(device)
    y = (torch.randn(g, m, d, generator=gen) * 0.3).to(device)
    scale = -1.0 / 4.0
    if r["kernel"] == "kernel_fwd":
        return lambda: laplace_kernel_fwd(x, y, scale, True)
    if r["kernel"] == "kernel_bwd":
        c = laplace_kernel_fwd(x, y, scale, True)
        dc = torch.randn_like(c)
        return lambda: laplace_kernel_bwd(x, y, dc, c, scale, True)
    w = laplace_kernel_fwd(y, y, scale, True) + 0.01 * torch.eye(m, device=device)
    if r["kernel"] == "ns_fwd":
        return lambda: newton_schulz_fwd(w, ITERS)
    v = newton_schulz_fwd(w, ITERS)
    gv = torch.randn_like(v)
    return lambda: implicit_grad(v, gv)


def measure(repeats: int = 20, out: Path | None = None) -> int:
    """Times every row of the estimate table on CUDA (median of ``repeats`` after a warm-up, CUDA events:
    ``harness.cuda_event_times``) and prints measured vs estimated; the rows go to ``out`` (JSON)."""
    import torch

    from laplacianformer.bench.harness import cuda_event_times

    if not torch.cuda.is_available():
        print("roofline: no CUDA device; nothing measured", file=sys.stderr)
        return 1
    results = []
    print(f"device: {torch.cuda.get_device_name()}; estimate for {PEAK['name']}")
    print("| res | stage | kernel | N | est. µs | measured µs | measured / est. |")
    print("|---|---|---|---|---|---|---|")
    for r in cases():
        if r["kernel"] not in TIMED:
            continue  # the fused passes: timed per layer and per backbone by benchmarks/gpu_check.sh
        times = [ms * 1e3 for ms in cuda_event_times(_run_case(r, "cuda"), repeats)]
        med = sorted(times)[len(times) // 2]
        results.append(dict(r, measured_us=round(med, 2), ratio=round(med / r["est_us"], 2)))
        print(f"| {r['res']} | {r['stage']} | {r['kernel']} | {r['n']} | {r['est_us']} | {med:.1f} | "
              f"{med / r['est_us']:.2f} |", flush=True)
    if out is not None:
        write_text(out, json.dumps({"device": torch.cuda.get_device_name(), "rows": results}, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--write", action="store_true", help="write the estimate table (stem roofline_h100)")
    ap.add_argument("--measure", action="store_true", help="on CUDA: measured vs estimated (stem roofline_measured)")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--ns-prediction", action="store_true",
                    help="print the Newton–Schulz forward's prediction for 64 matrices 49x49, 20 steps (ns_prediction)")
    add_output_options(ap)
    args = ap.parse_args(argv)
    if args.ns_prediction:
        print(json.dumps(ns_prediction(), indent=1))
        return 0
    if args.measure:
        return measure(repeats=args.repeats, out=output_stem(args, "roofline", "roofline_measured").with_suffix(".json"))
    if args.write:
        write(output_stem(args, "roofline", "roofline_h100"))
    else:
        print(table(cases()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
