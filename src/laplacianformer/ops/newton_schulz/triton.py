"""Batched Newton–Schulz Triton kernels (docs/DESIGN.md §3, §6), all B·H matrices in one launch, m <= 128.

- m <= 64 (``ONCHIP_MAX_M``; the model's m = 49): ``newton_schulz_onchip_kernel``, one program per matrix:
  V, W = P V and the best iterate stay in registers as (BM, BM) float32 blocks, BM = max(16, next power of
  two of m) (49 -> 64), padded with zeros (a zero row/column of P keeps V's zero there, so the m×m block is
  the unpadded iteration). alpha = 1.8 / (max_i sum_j |P_ij|)^2 per matrix, V0 = alpha·P, then ``iters``
  steps of V <- 2V - V W, W <- P V as ``tl.dot`` products in ``PRECISION`` ("tf32x3": three TF32
  tensor-core products per product, float32 accumulation; never plain TF32, whose 1e-3..1e-2 error breaks
  the 1e-5 agreement with float64), their operands read in k-chunks of 16 (P from the input, V and W from a
  per-matrix float32 scratch (B, 3, BM, BM) written once per step and read back from L1): whole ``tl.dot``
  operands of 64×64 spill registers on sm_80 and sm_90 (docs/KERNELS.md, "Newton–Schulz on chip"). Its body
  is the ``@triton.jit`` helper ``onchip_iterate``, which the fused landmark solve
  (``ops/streaming/landmarks_triton.py``) runs too.
- 64 < m <= 128: ``newton_schulz_fwd_kernel``, the tiled form: the iterates and W live in a float32
  scratch (3, B, m, m) that stays in L2; the products run tile by tile (``tiled_config``: TILE² outputs, k
  in chunks of BLOCK_K), the phases of a step separated by CTA barriers, IEEE float32 products (the
  earlier whole-matrix-in-registers version spilled ~90 KB per thread at m = 128).
- Safeguard, the reference's rule (``naive.newton_schulz_iterate_reference``): ||I - P V||_F is measured
  for V0 and at every ``CHECK_EVERY``-th step and after the last one (on chip: only at those steps, from
  the W = P V the next step needs anyway); an iterate whose residual is no larger than the best checked one
  becomes the output (on chip a register select, ``tl.where``), so a residual that grows or is not finite
  (NaN compares false) keeps the earlier iterate. There is no ``tol`` stop (the registry refuses ``tol``:
  the reference stops when the whole batch is within it).
- ``implicit_grad_onchip_kernel`` (m <= 64) / ``implicit_grad_kernel`` (tiled, through a float32 scratch):
  dL/dW = -Vᵀ G Vᵀ, the implicit backward of ``_ImplicitInverse``, one program per matrix.
Inputs float32/float16/bfloat16 (half inputs run the float32 kernels on upcast copies: the matrices are
small, and the half loads hit ptxas register caps on sm_90); results in the input dtype. ``aot_specialisations`` lists every
specialisation the launchers produce (``benchmarks/triton_aot.py``).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .._triton_common import dot, load_block, store_block

MAX_M = 128
ONCHIP_MAX_M = 64
PRECISION = "tf32x3"
"""The on-chip kernels' product precision (``tl.dot`` input_precision): "tf32x3" or "ieee", never "tf32"."""
CHECK_EVERY = 5
"""Steps between residual checks: the value of ``naive.CHECK_EVERY`` (equal by a test; not imported, so
that this module stays loadable on its own by ``benchmarks/triton_aot.py``)."""


@triton.jit
def _onchip_block(ri, rj, M):
    """(offsets, mask) of the (BM, BM) block of a row-major (M, M) matrix, masked past M."""
    return ri[:, None] * M + rj[None, :], (ri[:, None] < M) & (rj[None, :] < M)


@triton.jit
def _eye_residual(w, ri, rj, M):
    """||I - W||_F of the m×m block (W is zero outside it, and so is the identity used here)."""
    r = tl.where((ri[:, None] == rj[None, :]) & (ri[:, None] < M), 1.0, 0.0) - w
    return tl.sqrt(tl.sum(tl.sum(r * r, axis=1), axis=0))


@triton.jit
def _chunk_product(A, sa_r, sa_c, MA, B, sb_r, sb_c, MB, BM: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    """The (BM, BM) product A @ B in float32, k in BM / BLOCK_K chunks: A's (BM, BLOCK_K) and B's
    (BLOCK_K, BM) column/row chunks are read with the given strides (zero past MA / MB rows and columns),
    so no operand is ever whole in registers. A loop, not ``tl.static_range``: unrolled, the chunks' loads
    in flight spill at BM = 64 (benchmarks/triton_aot.py --strict)."""
    ri = tl.arange(0, BM)
    acc = tl.zeros((BM, BM), dtype=tl.float32)
    for k0 in range(0, BM, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + ri[:, None] * sa_r + rk[None, :] * sa_c, mask=(ri[:, None] < MA) & (rk[None, :] < MA),
                    other=0.0).to(tl.float32)
        b = tl.load(B + rk[:, None] * sb_r + ri[None, :] * sb_c, mask=(rk[:, None] < MB) & (ri[None, :] < MB),
                    other=0.0).to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=PRECISION)
    return acc


@triton.jit
def onchip_iterate(Pb, sp, S, M, iters, CHECK: tl.constexpr, BM: tl.constexpr, BLOCK_K: tl.constexpr,
                   PRECISION: tl.constexpr):
    """The on-chip iteration of one matrix, M <= BM: P (M, M) at Pb with row stride ``sp`` (columns
    contiguous), S the matrix's float32 scratch (3, BM, BM) (two iterate slots and W). Returns the best
    checked iterate, a (BM, BM) float32 block, zero outside the m×m block. V, W = P V and the best iterate
    stay in registers; the products read their operands in k-chunks from P and from S, written once per
    step, so a step is 2·BM/BLOCK_K chunk rounds between two CTA barriers. Shared by
    ``newton_schulz_onchip_kernel`` and the fused landmark solve (``ops/streaming/landmarks_triton.py``)."""
    ri = tl.arange(0, BM)
    rj = tl.arange(0, BM)
    mask = (ri[:, None] < M) & (rj[None, :] < M)
    sq = ri[:, None] * BM + rj[None, :]
    Wb = S + 2 * BM * BM
    p = tl.load(Pb + ri[:, None] * sp + rj[None, :], mask=mask, other=0.0).to(tl.float32)
    rowmax = tl.max(tl.sum(tl.abs(p), axis=1), axis=0)
    v = p * (1.8 / (rowmax * rowmax))
    tl.store(S + sq, v)
    tl.debug_barrier()
    w = _chunk_product(Pb, sp, 1, M, S, BM, 1, BM, BM, BLOCK_K, PRECISION)
    tl.store(Wb + sq, w)
    best = v
    best_res = _eye_residual(w, ri, rj, M)
    tl.debug_barrier()
    cur = 0
    for step in range(iters):
        nxt = 1 - cur
        v = 2.0 * v - _chunk_product(S + cur * BM * BM, BM, 1, BM, Wb, BM, 1, BM, BM, BLOCK_K, PRECISION)
        tl.store(S + nxt * BM * BM + sq, v)  # the other slot: the product above may still be reading this one
        tl.debug_barrier()
        w = _chunk_product(Pb, sp, 1, M, S + nxt * BM * BM, BM, 1, BM, BM, BLOCK_K, PRECISION)
        tl.store(Wb + sq, w)  # W's last readers finished before the barrier above
        tl.debug_barrier()
        # keep-best at the reference's checks (every CHECK steps and the last): a residual that grew or is
        # not finite (NaN compares false) keeps the earlier iterate
        if ((step + 1) % CHECK == 0) | (step + 1 == iters):
            res = _eye_residual(w, ri, rj, M)
            better = res <= best_res
            best = tl.where(better, v, best)
            best_res = tl.where(better, res, best_res)
        cur = nxt
    return best


@triton.jit
def newton_schulz_onchip_kernel(P, V, WORK, M, iters, CHECK: tl.constexpr, BM: tl.constexpr,
                                BLOCK_K: tl.constexpr, PRECISION: tl.constexpr):
    """One program per matrix, M <= BM: ``onchip_iterate`` on P (B, M, M) with the per-matrix float32
    scratch WORK (B, 3, BM, BM) (two iterate slots and W; 48 KB at BM = 64, meant to stay in L1)."""
    b = tl.program_id(0).to(tl.int64)
    offs, mask = _onchip_block(tl.arange(0, BM), tl.arange(0, BM), M)
    best = onchip_iterate(P + b * M * M, M, WORK + b * 3 * BM * BM, M, iters, CHECK, BM, BLOCK_K, PRECISION)
    tl.store(V + b * M * M + offs, best.to(V.dtype.element_ty), mask=mask)


@triton.jit
def implicit_grad_onchip_kernel(V, G, DW, WORK, M, BM: tl.constexpr, BLOCK_K: tl.constexpr,
                                PRECISION: tl.constexpr):
    """dW = -(Vᵀ G) Vᵀ for one matrix per program, M <= BM: two chunked products, Vᵀ G through the float32
    scratch WORK (B, BM, BM)."""
    b = tl.program_id(0).to(tl.int64)
    ri = tl.arange(0, BM)
    rj = tl.arange(0, BM)
    offs, mask = _onchip_block(ri, rj, M)
    Vb = V + b * M * M
    T = WORK + b * BM * BM
    t = _chunk_product(Vb, 1, M, M, G + b * M * M, M, 1, M, BM, BLOCK_K, PRECISION)
    tl.store(T + ri[:, None] * BM + rj[None, :], t)
    tl.debug_barrier()
    dw = -_chunk_product(T, BM, 1, BM, Vb, 1, M, M, BM, BLOCK_K, PRECISION)
    tl.store(DW + b * M * M + offs, dw.to(DW.dtype.element_ty), mask=mask)


@triton.jit
def _mm_tile(A, sa_r, sa_c, B, sb_r, sb_c, ri, rj, M, IEEE: tl.constexpr, TILE: tl.constexpr,
             BLOCK_K: tl.constexpr):
    """(A @ B)[ri, rj] for (M, M) matrices with the given row/column strides, float32, summed over k in
    chunks of BLOCK_K read from memory (``.cg``: the operands may have been written by this program)."""
    acc = tl.zeros((TILE, TILE), dtype=tl.float32)
    for k0 in range(0, M, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + ri[:, None] * sa_r + rk[None, :] * sa_c, mask=(ri[:, None] < M) & (rk[None, :] < M),
                    other=0.0, cache_modifier=".cg").to(tl.float32)
        b = tl.load(B + rk[:, None] * sb_r + rj[None, :] * sb_c, mask=(rk[:, None] < M) & (rj[None, :] < M),
                    other=0.0, cache_modifier=".cg").to(tl.float32)
        acc += dot(a, b, IEEE)
    return acc


# The phases below walk the (M, M) matrices in (TILE, TILE) tiles: rows ri = i0 + arange(TILE), columns
# j0 .. j0 + TILE, masked past M. A phase that reads and writes the same tile (V0, the step, the copy)
# addresses it by one offset tensor (``_tile``); the others through load_block / store_block. Each keeps
# the form it was sized with: ptxas allocates registers differently for the two (one form everywhere makes
# ns_fwd spill at m = 128 on sm_90, benchmarks/triton_aot.py --strict).


@triton.jit
def _tile(ri, j0, M, TILE: tl.constexpr):
    """(offsets, mask) of the tile rows ri x columns j0 .. j0 + TILE of a row-major (M, M) matrix."""
    rj = j0 + tl.arange(0, TILE)
    return ri[:, None] * M + rj[None, :], (ri[:, None] < M) & (rj[None, :] < M)


@triton.jit
def _product_residual(Pb, Vb, Wb, M, IEEE: tl.constexpr, TILE: tl.constexpr, BLOCK_K: tl.constexpr):
    """W = P V tile by tile; returns ||I - W||_F."""
    sq = tl.zeros((TILE, TILE), dtype=tl.float32)
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        for j0 in range(0, M, TILE):
            rj = j0 + tl.arange(0, TILE)
            w = _mm_tile(Pb, M, 1, Vb, M, 1, ri, rj, M, IEEE, TILE, BLOCK_K)
            store_block(Wb, w, ri, M, M, j0, TILE)
            r = tl.where(ri[:, None] == rj[None, :], 1.0, 0.0) - w
            sq += tl.where((ri[:, None] < M) & (rj[None, :] < M), r * r, 0.0)
    return tl.sqrt(tl.sum(tl.sum(sq, axis=1), axis=0))


@triton.jit
def _init(Pb, cur, Ob, M, TILE: tl.constexpr):
    """V0 = alpha·P into ``cur`` and the output ``Ob``, alpha = 1.8 / (max_i sum_j |P_ij|)^2."""
    rowmax = 0.0
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        rs = tl.zeros((TILE,), dtype=tl.float32)
        for j0 in range(0, M, TILE):
            rs += tl.sum(tl.abs(load_block(Pb, ri, M, M, j0, TILE)), axis=1)
        rowmax = tl.maximum(rowmax, tl.max(rs, axis=0))
    alpha = 1.8 / (rowmax * rowmax)
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        for j0 in range(0, M, TILE):
            offs, mask = _tile(ri, j0, M, TILE)
            v0 = tl.load(Pb + offs, mask=mask, other=0.0).to(tl.float32) * alpha
            tl.store(cur + offs, v0, mask=mask)
            tl.store(Ob + offs, v0.to(Ob.dtype.element_ty), mask=mask)


@triton.jit
def _step(cur, Wb, nxt, M, IEEE: tl.constexpr, TILE: tl.constexpr, BLOCK_K: tl.constexpr):
    """nxt = 2 cur - cur W, W = P cur (from the previous phase)."""
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        for j0 in range(0, M, TILE):
            offs, mask = _tile(ri, j0, M, TILE)
            vw = _mm_tile(cur, M, 1, Wb, M, 1, ri, j0 + tl.arange(0, TILE), M, IEEE, TILE, BLOCK_K)
            v = tl.load(cur + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(nxt + offs, 2.0 * v - vw, mask=mask)


@triton.jit
def _copy(SRC, DST, M, TILE: tl.constexpr):
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        for j0 in range(0, M, TILE):
            offs, mask = _tile(ri, j0, M, TILE)
            v = tl.load(SRC + offs, mask=mask, other=0.0, cache_modifier=".cg")
            tl.store(DST + offs, v.to(DST.dtype.element_ty), mask=mask)


@triton.jit
def newton_schulz_fwd_kernel(P, V, WORK, M, iters, CHECK: tl.constexpr, IEEE: tl.constexpr,
                             TILE: tl.constexpr, BLOCK_K: tl.constexpr):
    """One program per matrix. WORK: float32 (3, B, M, M) scratch (two iterates and W = P V) that stays in
    L2; V: the best iterate so far (the output). Phases are separated by CTA barriers."""
    b = tl.program_id(0)
    nb = tl.num_programs(0)
    Pb = P + b * M * M
    Ob = V + b * M * M
    cur = WORK + b * M * M
    nxt = WORK + (nb + b) * M * M
    Wb = WORK + (2 * nb + b) * M * M
    _init(Pb, cur, Ob, M, TILE)
    tl.debug_barrier()
    best = _product_residual(Pb, cur, Wb, M, IEEE, TILE, BLOCK_K)
    tl.debug_barrier()
    for step in range(iters):
        _step(cur, Wb, nxt, M, IEEE, TILE, BLOCK_K)
        tl.debug_barrier()
        res = _product_residual(Pb, nxt, Wb, M, IEEE, TILE, BLOCK_K)
        tl.debug_barrier()
        # keep-best at the reference's checks (every CHECK steps and the last): a residual that grew or
        # is not finite (NaN compares false) keeps the earlier iterate
        if (((step + 1) % CHECK == 0) | (step + 1 == iters)) & (res <= best):
            _copy(nxt, Ob, M, TILE)
            best = res
        cur, nxt = nxt, cur


@triton.jit
def _product_into(A, sa_r, sa_c, B, sb_r, sb_c, OUT, M, NEGATE: tl.constexpr, IEEE: tl.constexpr,
                 TILE: tl.constexpr, BLOCK_K: tl.constexpr):
    """OUT = A @ B, or -(A @ B) with NEGATE: A and B with the given strides, OUT row-major; tile by tile."""
    for i0 in range(0, M, TILE):
        ri = i0 + tl.arange(0, TILE)
        for j0 in range(0, M, TILE):
            t = _mm_tile(A, sa_r, sa_c, B, sb_r, sb_c, ri, j0 + tl.arange(0, TILE), M, IEEE, TILE, BLOCK_K)
            if NEGATE:
                t = -t
            store_block(OUT, t, ri, M, M, j0, TILE)


@triton.jit
def implicit_grad_kernel(V, G, DW, WORK, M, IEEE: tl.constexpr, TILE: tl.constexpr, BLOCK_K: tl.constexpr):
    """dW = -(Vᵀ G) Vᵀ for one matrix per program; Vᵀ G goes through the float32 scratch WORK (B, M, M)."""
    b = tl.program_id(0)
    Vb = V + b * M * M
    Gb = G + b * M * M
    Tb = WORK + b * M * M
    _product_into(Vb, 1, M, Gb, M, 1, Tb, M, False, IEEE, TILE, BLOCK_K)
    tl.debug_barrier()
    _product_into(Tb, M, 1, Vb, 1, M, DW + b * M * M, M, True, IEEE, TILE, BLOCK_K)


def onchip_config(m: int) -> dict:
    """Launch configuration of the on-chip kernels for (m, m) matrices, m <= ONCHIP_MAX_M: the block side BM,
    the k-chunk BLOCK_K and the warps (one per 8 rows of the block); checked by
    ``benchmarks/triton_aot.py --strict``."""
    if m > ONCHIP_MAX_M:
        raise ValueError(f"m: expected at most {ONCHIP_MAX_M} for the on-chip kernels, got {m}")
    block = max(16, triton.next_power_of_2(m))
    return dict(BM=block, BLOCK_K=16, num_warps=block // 8, num_stages=1)


def tiled_config(m: int) -> dict:
    """Launch configuration of the tiled kernels for ONCHIP_MAX_M < m <= MAX_M: output tiles of 64² (four at
    m = 128), products over k in chunks of 16 read from L1/L2, 8 warps; sized so that
    ``benchmarks/triton_aot.py --strict`` finds no spill on sm_80 and sm_90."""
    if m > MAX_M:
        raise ValueError(f"m: expected at most {MAX_M}, got {m}")
    return dict(TILE=64, BLOCK_K=16, num_warps=8, num_stages=1)


def aot_specialisations(d_max: int = 128, m_max: int = MAX_M):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label) the launchers can produce for
    m <= m_max, from ``onchip_config`` / ``tiled_config`` (benchmarks/triton_aot.py)."""
    top = max(16, triton.next_power_of_2(min(m_max, MAX_M)))
    for m in (16, 32, 64):  # on chip, each block side labelled with its largest m
        if m <= min(top, ONCHIP_MAX_M):
            yield from _solve_and_grad(newton_schulz_onchip_kernel, implicit_grad_onchip_kernel, onchip_config(m),
                                       dict(PRECISION=PRECISION), m)
    if top > ONCHIP_MAX_M:  # tiled: 64 < m <= 128
        yield from _solve_and_grad(newton_schulz_fwd_kernel, implicit_grad_kernel, tiled_config(MAX_M),
                                   dict(IEEE=True), MAX_M)


def _solve_and_grad(solve, grad, config: dict, constexprs: dict, m: int):
    """The AOT entries of one configuration's solve and implicit-gradient kernels (``aot_specialisations``), labelled
    with the largest m of their block side; float32 pointers (half inputs are upcast by the launchers)."""
    cfg = dict(config)
    warps, stages = cfg.pop("num_warps"), cfg.pop("num_stages")
    meta = dict(cfg, **constexprs)
    yield (solve, {"P": "*fp32", "V": "*fp32", "WORK": "*fp32", "M": "i32", "iters": "i32"},
           dict(meta, CHECK=CHECK_EVERY), warps, stages, f"ns_fwd dtype=fp32 m={m}")
    yield (grad, {"V": "*fp32", "G": "*fp32", "DW": "*fp32", "WORK": "*fp32", "M": "i32"}, meta, warps, stages,
           f"ns_grad dtype=fp32 m={m}")


def _newton_schulz_f32(p: torch.Tensor, iters: int) -> torch.Tensor:
    b, m, _ = p.shape
    v = torch.empty_like(p)
    if m <= ONCHIP_MAX_M:
        cfg = onchip_config(m)
        work = torch.empty(b, 3, cfg["BM"], cfg["BM"], dtype=torch.float32, device=p.device)
        wrap_triton(newton_schulz_onchip_kernel)[(b,)](p, v, work, m, iters, CHECK=CHECK_EVERY, PRECISION=PRECISION,
                                                       **cfg)
        return v
    work = torch.empty(3, b, m, m, dtype=torch.float32, device=p.device)
    wrap_triton(newton_schulz_fwd_kernel)[(b,)](p, v, work, m, iters, CHECK=CHECK_EVERY, IEEE=True,
                                                **tiled_config(m))
    return v


def _implicit_grad_f32(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    b, m, _ = v.shape
    dw = torch.empty_like(v)
    if m <= ONCHIP_MAX_M:
        cfg = onchip_config(m)
        work = torch.empty(b, cfg["BM"], cfg["BM"], dtype=torch.float32, device=v.device)
        wrap_triton(implicit_grad_onchip_kernel)[(b,)](v, grad, dw, work, m, PRECISION=PRECISION, **cfg)
        return dw
    work = torch.empty(b, m, m, dtype=torch.float32, device=v.device)
    wrap_triton(implicit_grad_kernel)[(b,)](v, grad, dw, work, m, IEEE=True, **tiled_config(m))
    return dw


@triton_op("laplacianformer::newton_schulz_fwd", mutates_args=())
def newton_schulz_fwd(p: torch.Tensor, iters: int) -> torch.Tensor:
    """V ≈ P^{-1}: ``iters`` Newton–Schulz steps with the reference's keep-best rule.  p: (B, m, m)
    contiguous, symmetric, m <= 128. Half inputs run in float32 on an upcast copy (the half loads hit
    ptxas register caps on sm_90; the matrices are small)."""
    if p.dtype != torch.float32:
        return _newton_schulz_f32(p.float(), iters).to(p.dtype)
    return _newton_schulz_f32(p, iters)


@triton_op("laplacianformer::newton_schulz_implicit_grad", mutates_args=())
def implicit_grad(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """-Vᵀ G Vᵀ.  v, grad: (B, m, m) contiguous -> (B, m, m); half inputs in float32 as above."""
    if v.dtype != torch.float32:
        return _implicit_grad_f32(v.float(), grad.float()).to(v.dtype)
    return _implicit_grad_f32(v, grad)


def newton_schulz_iterate_triton(p: torch.Tensor, iters: int) -> torch.Tensor:
    """``iters`` Newton–Schulz steps with the reference's check schedule and keep-best rule.
    p: (..., m, m) symmetric -> (..., m, m)."""
    m = p.shape[-1]
    return newton_schulz_fwd(p.reshape(-1, m, m).contiguous(), int(iters)).reshape(p.shape)


def implicit_grad_triton(v: torch.Tensor, grad: torch.Tensor) -> torch.Tensor:
    """-Vᵀ G Vᵀ per matrix.  v, grad: (..., m, m)."""
    m = v.shape[-1]
    return implicit_grad(v.reshape(-1, m, m).contiguous(), grad.reshape(-1, m, m).contiguous()).reshape(v.shape)
