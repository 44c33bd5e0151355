"""The fused landmark solve in Triton (docs/KERNELS.md, "The fused landmark solve"): one launch, one program
per (batch, head) group g = b·H + h, computing what ``nystrom()`` needs before the streaming passes;
the specification is ``landmarks.landmark_solve_reference``.

1. **Landmarks** L (m, d), docs/DESIGN.md §2.1: adaptive average pooling of the group's queries, read in
   place through their (batch, head, token) strides (last dim contiguous), in their dtype (float32, float16
   or bfloat16: converted to float32 right after the load), as a (gh, gw) token grid, to the
   (lh, lw) landmark grid, with the bins of ``pooling.adaptive_pool_matrix`` (row i of an axis of n inputs
   and ``out`` outputs averages floor(i·n/out) .. ceil((i+1)·n/out) − 1). Landmark row i's bin of token rows
   is one contiguous run of tokens, walked in tiles of BLOCK_T tokens: each tile adds A·x to the row's
   (lw, d) sums, A (lw, BLOCK_T) the 0/1 membership of the tokens' columns in the column bins (exact in
   TF32, so the "tf32x3" product keeps float32 accuracy); the sums divided by the bin areas are L, written
   to the output (the streaming passes read it).
2. **W = k(L, L)** of the kernel family (constexpr ``KID``: ``_triton_common.kernel_value`` on the accumulated
   distance, exp(−dist / bandwidth) for the Laplacian and the Gaussian), the convention of the streaming passes'
   ``_kernel_tile`` and of ``ops/kernel``: from L as written (read
   back after a CTA barrier) by ``kernel.triton._distance``, the register-blocked loop over single features
   (each thread a (R, C) block of the (BM, BM) tile, no shuffles, no 3-D reduction). Written to W and, with
   eps on the diagonal, P = W + eps·I to the fourth slot of the per-matrix float32 scratch WORK (G, 4, BM, BM).
3. **W⁺** ≈ P⁻¹, docs/DESIGN.md §3: ``newton_schulz.triton.onchip_iterate``, the body of
   ``newton_schulz_onchip_kernel`` (alpha = 1.8 / (max row abs sum)², ``iters`` steps, tf32x3 products on
   k-chunks read from the scratch, keep-best at the reference's checks as a register select).

q float32, float16 or bfloat16 (``limits.LOAD_DTYPES``), L, W and W⁺ float32 whatever q's dtype; m <= 64,
d <= 128 (``limits.solve_unfit``), forward only. The launch configuration is the on-chip solver's
(``onchip_config``: BM, BM/8 warps) plus the pooling tile and the distance blocking (``config``);
``aot_specialisations`` lists every one, per q dtype, for ``benchmarks/triton_aot.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_common import kernel_value
from ..kernel.limits import TRITON_KERNEL_IDS
from ..kernel.triton import _blocked_rows, _distance
from ..newton_schulz.triton import CHECK_EVERY, PRECISION, _onchip_block, onchip_config, onchip_iterate
from .limits import MAX_D, MAX_M, solve_unfit, triton_kernel_id
from .triton import MAXNREG, TYPE_NAMES


@triton.jit
def _pool_row(Qg, sqn, Lg, i, GH, GW, LH, LW, D, PRECISION: tl.constexpr, BLOCK_T: tl.constexpr,
              BLOCK_LW: tl.constexpr, BLOCK_D: tl.constexpr):
    """Landmarks i·LW .. i·LW + LW − 1 (landmark row i) of the group at Qg (token stride sqn) into Lg (M, D)."""
    rj = tl.arange(0, BLOCK_LW)
    rd = tl.arange(0, BLOCK_D)
    lo_c = (rj * GW) // LW
    hi_c = ((rj + 1) * GW + LW - 1) // LW
    r0 = (i * GH) // LH
    r1 = ((i + 1) * GH + LH - 1) // LH
    t_end = r1 * GW
    acc = tl.zeros((BLOCK_LW, BLOCK_D), dtype=tl.float32)
    for t0 in range(r0 * GW, t_end, BLOCK_T):
        t = t0 + tl.arange(0, BLOCK_T)
        ok = t < t_end
        x = tl.load(Qg + t[:, None] * sqn + rd[None, :], mask=ok[:, None] & (rd[None, :] < D), other=0.0)
        col = t % GW
        a = tl.where(ok[None, :] & (col[None, :] >= lo_c[:, None]) & (col[None, :] < hi_c[:, None]), 1.0, 0.0)
        acc = tl.dot(a, x.to(tl.float32), acc, input_precision=PRECISION)
    area = ((hi_c - lo_c) * (r1 - r0)).to(tl.float32)
    tl.store(Lg + (i * LW + rj)[:, None] * D + rd[None, :], acc / area[:, None],
             mask=(rj[:, None] < LW) & (rd[None, :] < D))


@triton.jit
def landmark_solve_kernel(Q, sqb, sqh, sqn, L, W, WI, WORK, H, GH, GW, LH, LW, D, scale, eps, iters,
                          KID: tl.constexpr, CHECK: tl.constexpr, BM: tl.constexpr, BLOCK_K: tl.constexpr,
                          PRECISION: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_LW: tl.constexpr,
                          BLOCK_D: tl.constexpr, R: tl.constexpr, C: tl.constexpr, TN: tl.constexpr,
                          TM: tl.constexpr, KU: tl.constexpr):
    """One program per group: L (G, M, D), W and W⁺ = WI (G, M, M), M = LH·LW <= BM = R·TN = C·TM."""
    g = tl.program_id(0).to(tl.int64)
    b, h = g // H, g % H
    M = LH * LW
    Qg = Q + b * sqb + h * sqh
    Lg = L + g * M * D
    for i in range(0, LH):
        _pool_row(Qg, sqn, Lg, i, GH, GW, LH, LW, D, PRECISION, BLOCK_T, BLOCK_LW, BLOCK_D)
    tl.debug_barrier()  # L complete before any thread reads it back
    w = kernel_value(_distance(Lg, Lg, 0, 0, M, M, D, KID, R, C, TN, TM, KU), scale, KID)
    rows, cols = _blocked_rows(0, R, TN, 0), _blocked_rows(0, C, TM, 1)
    inside = (rows < M) & (cols < M)
    tl.store(W + g * M * M + rows * M + cols, w, mask=inside)
    S = WORK + g * 4 * BM * BM
    Pb = S + 3 * BM * BM
    tl.store(Pb + rows * BM + cols, tl.where(rows == cols, w + eps, w), mask=inside)
    tl.debug_barrier()  # P complete before the solve reads it
    best = onchip_iterate(Pb, BM, S, M, iters, CHECK, BM, BLOCK_K, PRECISION)
    offs, mask = _onchip_block(tl.arange(0, BM), tl.arange(0, BM), M)
    tl.store(WI + g * M * M + offs, best, mask=mask)


BLOCKING = {16: dict(R=2, C=2, TN=8, TM=8), 32: dict(R=2, C=4, TN=16, TM=8), 64: dict(R=4, C=4, TN=16, TM=16)}
"""The (BM, BM) distance tile of W per block side (``kernel.triton._distance``): TN·TM threads (the
solver's BM/8 warps), each R rows × C landmarks; R < TM and C < TN keep the feature loads in the
accumulator's layout."""
KU = 8
"""Features per iteration of the distance loop (unrolled)."""


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def config(m: int, d: int, lw: int, dtype: torch.dtype = torch.float32) -> dict:
    """Launch configuration for m = lh·lw landmarks of head dim d: the on-chip solver's (BM, BLOCK_K, warps,
    stages), the pooling tile (BLOCK_T tokens × BLOCK_D = next power of two of d, at most 16 elements per
    thread, at most 32 tokens: 64-token tiles spilled 8–872 bytes on sm_80 at BM = 32 and 64 with
    BLOCK_D <= 64, benchmarks/triton_aot.py --strict; BLOCK_LW landmark columns) and the distance blocking
    of BM. For a half-precision q (``dtype``) also ``maxnreg`` = ``MAXNREG``: without it ptxas held the BM = 32,
    lw = 32, d = 128 kernel to 168 registers on sm_90 and spilled 32–40 bytes (244–250 registers with it; the
    float32 kernel takes 178 unasked, and its launch stays as it was)."""
    cfg = onchip_config(m)
    block_d = _p2(d)
    block_t = max(16, min(32, 512 * cfg["num_warps"] // block_d))
    cfg = dict(cfg, BLOCK_T=block_t, BLOCK_LW=_p2(lw), BLOCK_D=block_d, KU=KU, **BLOCKING[cfg["BM"]])
    return cfg if dtype == torch.float32 else dict(cfg, maxnreg=MAXNREG)


_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _launch(spec: dict) -> tuple[dict, dict]:
    opts = {k: spec[k] for k in _OPTIONS if k in spec}
    return {k: v for k, v in spec.items() if k not in opts}, opts


def landmark_solve_triton(qs: torch.Tensor, hw, grid, bandwidth: float, kernel: str, eps: float, iters: int):
    """(L (B, H, m, d), W (B, H, m, m), W⁺ (B, H, m, m)) of ``landmarks.landmark_solve_reference`` (same
    arguments) in one launch, float32. qs (B, H, N, d) float32, float16 or bfloat16 (read in its dtype, every
    sum in float32), any strides (a last dim that is not contiguous is copied). ValueError for what
    ``limits.solve_unfit`` refuses."""
    b, h, n, d = qs.shape
    (gh, gw), (lh, lw) = hw, grid
    m = lh * lw
    why = solve_unfit(m, d, qs.dtype)
    if why is not None:
        raise ValueError(f"landmark_solve_triton: {why}")
    if gh * gw != n:
        raise ValueError(f"landmark_solve_triton: hw={hw} is not a grid of the N={n} tokens")
    kid = triton_kernel_id("landmark_solve_triton", kernel)
    q = qs if qs.stride(-1) == 1 else qs.contiguous()
    meta, opts = _launch(config(m, d, lw, q.dtype))
    f32 = dict(dtype=torch.float32, device=q.device)
    marks = torch.empty(b, h, m, d, **f32)
    w = torch.empty(b, h, m, m, **f32)
    w_inv = torch.empty(b, h, m, m, **f32)
    work = torch.empty(b * h, 4, meta["BM"], meta["BM"], **f32)
    landmark_solve_kernel[(b * h,)](q, q.stride(0), q.stride(1), q.stride(2), marks, w, w_inv, work, h, gh, gw,
                                    lh, lw, d, -1.0 / float(bandwidth), float(eps), int(iters),
                                    KID=kid, CHECK=CHECK_EVERY, PRECISION=PRECISION, **meta, **opts)
    return marks, w, w_inv


_SIGNATURE = {"Q": "*fp32", "sqb": "i32", "sqh": "i32", "sqn": "i32", "L": "*fp32", "W": "*fp32", "WI": "*fp32",
              "WORK": "*fp32", "H": "i32", "GH": "i32", "GW": "i32", "LH": "i32", "LW": "i32", "D": "i32",
              "scale": "fp32", "eps": "fp32", "iters": "i32"}


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label[, options]) ``landmark_solve_triton`` can
    produce for m <= min(m_max, 64) and d <= min(d_max, 128), from ``config`` (benchmarks/triton_aot.py):
    the block side BM and BLOCK_LW <= BM (lw <= m) and BLOCK_D as powers of two, every kernel family the Triton
    profile has (``kernel.limits.TRITON_KERNEL_IDS``), and q of
    each dtype of ``limits.LOAD_DTYPES`` (float32 first, as before; Q typed ``*fp16|*bf16`` and the options
    ``{"maxnreg": MAXNREG}`` for the half ones, labels ``dtype=``)."""
    dims = lambda top, cap: [x for x in (16, 32, 64, 128) if x <= _p2(min(top, cap))]  # noqa: E731
    for dtype, name in TYPE_NAMES.items():
        for bm in dims(m_max, MAX_M):
            for blw in (x for x in (16, 32, 64) if x <= bm):
                for bd in dims(d_max, MAX_D):
                    for kid in sorted(TRITON_KERNEL_IDS):
                        meta, opts = _launch(config(bm, bd, blw, dtype))
                        meta = dict(meta, KID=kid, CHECK=CHECK_EVERY, PRECISION=PRECISION)
                        label = f"landmark_solve dtype={name} kid={kid} m={bm} lw={blw} d={bd}"
                        spec = (landmark_solve_kernel, dict(_SIGNATURE, Q=f"*{name}"), meta, opts["num_warps"],
                                opts["num_stages"], label)
                        yield spec if "maxnreg" not in opts else spec + ({"maxnreg": opts["maxnreg"]},)
