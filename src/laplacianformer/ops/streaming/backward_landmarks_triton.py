"""Passes C and E of the fused backward in Triton (docs/KERNELS.md, "The fused backward"); the specification is
``backward_reference.py``: ``landmark_grad`` (pass C) and ``pool_grad`` (pass E). Per (batch, head) group
g = b·H + h; the row passes' partials (G, S, ·) are summed here in split order (deterministic, no atomics).

- ``landmark_grad_kernel`` (pass C, grid (G,)): the m×m algebra of one group on chip, every product IEEE
  float32 (``tl.dot(..., input_precision="ieee")``) with its operands read in k-chunks from memory (``_product``:
  the state from its inputs, the intermediates dM, dS', T₁, T₂, dW⁺, W⁺ᵀ dW⁺ and G from a per-group float32
  scratch, written and read back across CTA barriers; whole (64, 64) operands in registers spilled). Walking e
  in chunks of ``BLOCK_E`` columns: dM = Σ_s pass A's partials (into the scratch), dW⁺ = dM M'ᵀ, Σ G and M' Σ G
  (for the query side's constant −(1/n) M Σ G, M = α W⁺ M', α the output scale of the whitened norms,
  docs/DESIGN.md §4.6: a runtime argument, 1 otherwise; pass A's dM already carries α, so dM' and dW⁺ = dM M'ᵀ
  with the unscaled M' need nothing more); then dM' = W⁺ᵀ dM (written) and dM' Σ v (the key side's
  −(1/n) Σ_j dk̃_j without whitening). Then, with ``WHITEN`` ("injective"): dS' = Σ_s pass B's partials, T₁ = W⁺ dS'ᵀ, T₂ = W⁺ dS', dW⁺ += S T₁ + Sᵀ T₂ and
  the query covariance term (dS + dSᵀ)/n = (T₁ + T₂) W⁺ᵀ / n (dS = W⁺ dS' W⁺ᵀ), the key constant −(1/n) Σ dk̃
  from pass B; dW = −W⁺ᵀ dW⁺ W⁺ᵀ, and dL through W = k(L, L): with
  G = dW ∘ dk/dD (``_triton_common.kernel_chain``: dW ∘ W · (−1/λ) for the Laplacian and the Gaussian; a family
  whose slope reads the distance sums D over d first, in the chunks below), dL_a = Σ_j (G + Gᵀ)_aj
  slope(L_a − L_j) (slope = sign for the L1 accumulation, 2·diff for the squared L2 one: ``kernel_rows_grad``'s
  dx + dmarks, both arguments L), over d in chunks of ``BLOCK_D`` columns as an (m, m, BLOCK_D) tile. With
  ``CONV`` the programs of batch 0 (g < H) also sum the conv's parameter gradients of their head over the batch
  and the splits: dweight (C, 1, 3, 3) from pass A's per-tap partials, dbias (C,) from its Σ G partials.
- ``pool_grad_kernel`` (pass E, grid (splits, G) of ``limits.splits_for``): dq += Pᵀ dL in place, dL = dL_W +
  Σ_s pass D's partials (m, d) formed per d chunk in the prologue, P the adaptive average pooling of the
  (gh, gw) token grid to the (lh, lw) landmark grid (bins of ``F.adaptive_avg_pool2d``: output bin a of an axis
  covers inputs floor(a·In/Out) .. ceil((a+1)·In/Out) − 1, so bins overlap when In/Out is no integer). Each
  row tile is A · (dL / area), A the 0/1 membership of the tile's tokens in the landmarks' bins (exact in TF32,
  so the "tf32x3" product keeps float32 accuracy). dq is float32, float16 or bfloat16 (the qkv gradient's
  dtype): each tile is loaded in that dtype, converted to float32, added to and stored once in its dtype.

Pass C reads only float32 state and partials (the conv weight only for its shape, any float dtype); its
outputs are float32. m <= 64, d, e <= 128 (``limits.unfit``). ``aot_specialisations`` lists every launch
configuration of both launchers for ``benchmarks/triton_aot.py`` (pass E per dq dtype).

**Register budget** (``python -m benchmarks.triton_aot --arch 80,90 --strict --module
laplacianformer.ops.streaming.backward_landmarks_triton``): pass C at 8 warps and 255 registers, its m×m
products from memory in k-chunks (``landmark_grad_spec`` says what spilled otherwise); with the conv at m = 64 it
held 255 / 254 registers on sm_80 / sm_90, and with α (one runtime scalar, multiplying q_const's (m) vector
once) 255 / 255, no spill. Pass E at 4 warps: 255 at most, no spill, with a float32, float16 or bfloat16 dq.
"""

from __future__ import annotations

from functools import partial

import torch
import triton
import triton.language as tl

from .._triton_common import distinct_launches, kernel_chain, power_of_two_sizes, slope_reads_distance, sums_abs
from .._triton_common import product_from_memory as _product
from ..kernel.limits import TRITON_KERNEL_IDS
from .backward_stats_triton import POINTER_TYPES, check_alpha
from .limits import (BLOCK_ROWS, LOAD_DTYPES, MAX_D, MAX_M, STREAMED_NORMS, splits_for, triton_kernel_id, unfit,
                     whitens)
from .triton import MAXNREG, _p2


@triton.jit
def _split_sum_tile(P, g, SPLITS, stride, offs, mask, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Σ_s P[(g·SPLITS + s)·stride + offs] over the splits in order: a (BLOCK_R, BLOCK_C) tile, 0 outside mask."""
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(P + (g * SPLITS + s) * stride + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def _split_sum_vec(P, g, SPLITS, stride, offs, mask, BLOCK: tl.constexpr):
    """Σ_s P[(g·SPLITS + s)·stride + offs] over the splits in order: a (BLOCK,) vector, 0 outside mask."""
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for s in range(0, SPLITS):
        acc += tl.load(P + (g * SPLITS + s) * stride + offs, mask=mask, other=0.0)
    return acc


@triton.jit
def _conv_param_grads(PDW, PG, DWEIGHT, DBIAS, h, B, H, E, SPLITS, BLOCK_E: tl.constexpr):
    """Head h's conv parameter gradients summed over the batch and the splits (b outer, s inner):
    dweight[h·E + j, 0, t // 3, t % 3] = Σ_b Σ_s PDW[b·H + h, s, t, j] (PDW (G, S, 9, E)) and
    dbias[h·E + j] = Σ_b Σ_s PG[b·H + h, s, j] (PG (G, S, E))."""
    rt = tl.arange(0, 16)
    for e0 in range(0, E, BLOCK_E):
        re = e0 + tl.arange(0, BLOCK_E)
        taps = (rt[:, None] < 9) & (re[None, :] < E)
        dweight = tl.zeros((16, BLOCK_E), dtype=tl.float32)
        dbias = tl.zeros((BLOCK_E,), dtype=tl.float32)
        for b in range(0, B):
            g = b * H + h
            dweight += _split_sum_tile(PDW, g, SPLITS, 9 * E, rt[:, None] * E + re[None, :], taps, 16, BLOCK_E)
            dbias += _split_sum_vec(PG, g, SPLITS, E, re, re < E, BLOCK_E)
        tl.store(DWEIGHT + (h * E + re[None, :]) * 9 + rt[:, None], dweight, mask=taps)
        tl.store(DBIAS + h * E + re, dbias, mask=re < E)


@triton.jit
def landmark_grad_kernel(WI, W, MARKS, COV, MP, VSUM, PDM, PG, PDSP, PDKT, PDW, WORK,
                         DMP, QCOV, QCONST, KCONST, VCONST, DMARKS, DWEIGHT, DBIAS,
                         B, H, M, D, E, SPLITS, n, scale, alpha,
                         WHITEN: tl.constexpr, CONV: tl.constexpr, KID: tl.constexpr,
                         BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr,
                         BLOCK_K: tl.constexpr):
    """Pass C of group program_id(0) (module docstring). State: WI = W⁺, W, COV = S (G, M, M), MARKS (G, M, D),
    MP = Σ M' (G, M, E), VSUM = Σ v (G, E); partials PDM (G, S, M, E), PG (G, S, E), PDSP (G, S, M, M),
    PDKT (G, S, M) (WHITEN), PDW (G, S, 9, E) (CONV) (read only under their flags); WORK the
    group's float32 scratch (4 (BLOCK_M, BLOCK_M) slots, then dM (M, E)), phases separated by CTA barriers.
    Writes DMP = dM' (G, M, E), QCOV (G, M, M) (WHITEN), QCONST, KCONST (G, M), VCONST (G, E),
    DMARKS (G, M, D), and with CONV for g < H, DWEIGHT (H·E, 1, 3, 3) and DBIAS (H·E,). alpha: the output scale α
    (M = α W⁺ M' in q_const)."""
    g = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    rows = rm < M
    square = rows[:, None] & rows[None, :]
    sq_offs = rm[:, None] * M + rm[None, :]
    slot_offs = rm[:, None] * BLOCK_M + rm[None, :]
    WIg = WI + g * M * M
    S0 = WORK + g * (4 * BLOCK_M * BLOCK_M + M * E)
    S1 = S0 + BLOCK_M * BLOCK_M
    S2 = S1 + BLOCK_M * BLOCK_M
    S3 = S2 + BLOCK_M * BLOCK_M
    DMg = S3 + BLOCK_M * BLOCK_M
    # e in chunks: dM = Σ_s partials (split order) into the scratch, dW⁺ = dM M'ᵀ, Σ G, M' Σ G
    dw_inv = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    mp_g = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for e0 in range(0, E, BLOCK_E):
        re = e0 + tl.arange(0, BLOCK_E)
        cols = re < E
        tile = rows[:, None] & cols[None, :]
        me_offs = rm[:, None] * E + re[None, :]
        dm = _split_sum_tile(PDM, g, SPLITS, M * E, me_offs, tile, BLOCK_M, BLOCK_E)
        tl.store(DMg + me_offs, dm, mask=tile)
        mp = tl.load(MP + g * M * E + me_offs, mask=tile, other=0.0)
        dw_inv = tl.dot(dm, tl.trans(mp), dw_inv, input_precision="ieee")
        g_sum = _split_sum_vec(PG, g, SPLITS, E, re, cols, BLOCK_E)
        tl.store(VCONST + g * E + re, g_sum / n, mask=cols)
        if WHITEN:
            mp_g += tl.sum(mp * g_sum[None, :], axis=1)
    if CONV:
        if g < H:
            _conv_param_grads(PDW, PG, DWEIGHT, DBIAS, g, B, H, E, SPLITS, BLOCK_E)
    q_const = tl.zeros((BLOCK_M,), dtype=tl.float32)
    k_const = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if WHITEN:  # −(1/n) M Σ G, M = α W⁺ M'
        q_const = -(tl.sum(tl.load(WIg + sq_offs, mask=square, other=0.0) * mp_g[None, :], axis=1) * alpha) / n
        k_const = -_split_sum_vec(PDKT, g, SPLITS, M, rm, rows, BLOCK_M) / n
        tl.store(S0 + slot_offs, _split_sum_tile(PDSP, g, SPLITS, M * M, sq_offs, square, BLOCK_M, BLOCK_M))
    tl.debug_barrier()  # dM (and dS') complete in the scratch
    # dM' = W⁺ᵀ dM, chunk by chunk; without whitening the key side's −(1/n) Σ_j dk̃_j = −(1/n) dM' Σ v
    dmp_v = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for e0 in range(0, E, BLOCK_E):
        re = e0 + tl.arange(0, BLOCK_E)
        cols = re < E
        tile = rows[:, None] & cols[None, :]
        dmp = _product(WIg, 1, M, DMg + e0, E, 1, M, M, E - e0, BLOCK_M, BLOCK_E, BLOCK_K)
        tl.store(DMP + g * M * E + rm[:, None] * E + re[None, :], dmp, mask=tile)
        if not WHITEN:
            dmp_v += tl.sum(dmp * tl.load(VSUM + g * E + re, mask=cols, other=0.0)[None, :], axis=1)
    if not WHITEN:
        k_const = -dmp_v / n
    tl.store(QCONST + g * M + rm, q_const, mask=rows)
    tl.store(KCONST + g * M + rm, k_const, mask=rows)
    if WHITEN:  # T₁ = W⁺ dS'ᵀ, T₂ = W⁺ dS'; dW⁺ += S T₁ + Sᵀ T₂; (dS + dSᵀ)/n = (T₁ + T₂) W⁺ᵀ / n
        t1 = _product(WIg, M, 1, S0, 1, BLOCK_M, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        t2 = _product(WIg, M, 1, S0, BLOCK_M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        tl.store(S1 + slot_offs, t1)
        tl.store(S2 + slot_offs, t2)
        tl.store(S3 + slot_offs, t1 + t2)
        tl.debug_barrier()
        COVg = COV + g * M * M
        dw_inv += _product(COVg, M, 1, S1, BLOCK_M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        dw_inv += _product(COVg, 1, M, S2, BLOCK_M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        q_cov = _product(S3, BLOCK_M, 1, WIg, 1, M, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K) / n
        tl.store(QCOV + g * M * M + sq_offs, q_cov, mask=square)
    # dW = −W⁺ᵀ dW⁺ W⁺ᵀ (through the scratch: slot 0's and 1's last readers are behind the barriers)
    tl.store(S0 + slot_offs, dw_inv)
    tl.debug_barrier()
    tl.store(S1 + slot_offs, _product(WIg, 1, M, S0, BLOCK_M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K))
    tl.debug_barrier()
    dw = -_product(S1, BLOCK_M, 1, WIg, 1, M, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
    # G = dW ∘ dk/dD (D recomputed where the slope reads it); dL_a = Σ_j (G + Gᵀ)_aj slope(L_a − L_j), d in chunks
    w = tl.load(W + g * M * M + sq_offs, mask=square, other=0.0)
    dist = w  # unread unless the slope reads the distance
    if slope_reads_distance(KID):
        dist = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            rd = d0 + tl.arange(0, BLOCK_D)
            lm = tl.load(MARKS + g * M * D + rm[:, None] * D + rd[None, :], mask=rows[:, None] & (rd[None, :] < D),
                         other=0.0)
            diff = lm[:, None, :] - lm[None, :, :]
            dist += tl.sum(diff * diff, axis=2)
    tl.store(S2 + slot_offs, kernel_chain(dw, w, dist, scale, KID, False))
    tl.debug_barrier()
    gs = tl.load(S2 + slot_offs, cache_modifier=".cg") + tl.load(S2 + rm[None, :] * BLOCK_M + rm[:, None],
                                                                 cache_modifier=".cg")
    Lg = MARKS + g * M * D
    for d0 in range(0, D, BLOCK_D):
        rd = d0 + tl.arange(0, BLOCK_D)
        tile = rows[:, None] & (rd[None, :] < D)
        lm = tl.load(Lg + rm[:, None] * D + rd[None, :], mask=tile, other=0.0)
        diff = lm[:, None, :] - lm[None, :, :]
        if sums_abs(KID):
            slope = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
        else:
            slope = 2.0 * diff
        d_marks = tl.sum(gs[:, :, None] * slope, axis=1)
        tl.store(DMARKS + g * M * D + rm[:, None] * D + rd[None, :], d_marks, mask=tile)


@triton.jit
def pool_grad_kernel(DQ, sqb, sqh, sqn, DLW, PDL, H, N, M, D, GH, GW, LH, LW, rows_per_split, SPLITS_L,
                     BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """Pass E for the rows of split program_id(0) of group program_id(1): dq (strides sqb, sqh, sqn, columns
    contiguous; float32, float16 or bfloat16: read, added to in float32, stored once in its dtype) += A · (dL /
    area), dL = DLW (G, M, D) + Σ_s PDL (G, SPLITS_L, M, D) per d chunk."""
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    DQg = DQ + b * sqb + h * sqh
    rm = tl.arange(0, BLOCK_M)
    marks = rm < M
    # landmark l's bin: rows lo_y .. hi_y − 1, columns lo_x .. hi_x − 1 of the token grid
    ly = rm // LW
    lx = rm - ly * LW
    lo_y = (ly * GH) // LH
    hi_y = ((ly + 1) * GH + LH - 1) // LH
    lo_x = (lx * GW) // LW
    hi_x = ((lx + 1) * GW + LW - 1) // LW
    area = tl.where(marks, (hi_y - lo_y) * (hi_x - lo_x), 1).to(tl.float32)
    lo = split * rows_per_split
    row_end = tl.minimum(lo + rows_per_split, N)
    for d0 in range(0, D, BLOCK_D):
        rd = d0 + tl.arange(0, BLOCK_D)
        cols = rd < D
        tile = marks[:, None] & cols[None, :]
        md_offs = rm[:, None] * D + rd[None, :]
        dl = tl.load(DLW + g * M * D + md_offs, mask=tile, other=0.0)
        dl += _split_sum_tile(PDL, g, SPLITS_L, M * D, md_offs, tile, BLOCK_M, BLOCK_D)
        dl = dl / area[:, None]
        for n0 in range(lo, row_end, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            ok = rn < row_end
            y = rn // GW
            x = rn - y * GW
            member = (ok[:, None] & marks[None, :] & (y[:, None] >= lo_y[None, :]) & (y[:, None] < hi_y[None, :])
                      & (x[:, None] >= lo_x[None, :]) & (x[:, None] < hi_x[None, :]))
            a = tl.where(member, 1.0, 0.0)
            ptrs = DQg + rn[:, None] * sqn + rd[None, :]
            inside = ok[:, None] & cols[None, :]
            dq = tl.load(ptrs, mask=inside, other=0.0).to(tl.float32)
            dq = tl.dot(a, dl, dq, input_precision="tf32x3")
            tl.store(ptrs, dq.to(DQ.dtype.element_ty), mask=inside)


_OPTIONS = ("num_warps", "num_stages", "maxnreg")
LANDMARK_GRAD_ELEMENTS = 8192
"""Elements of pass C's (BLOCK_M, BLOCK_M, BLOCK_D) slope tile (32 per thread at 8 warps)."""
BLOCK_REGISTERS = 65536
"""Registers of one thread block on sm_80 and sm_90: a launch of more (registers per thread × threads) fails
("too many resources requested for launch"). ptxas holds a kernel to ``.maxnreg`` even when that exceeds what
its ``.reqntid`` block can have (at 16 warps and ``.maxnreg`` 255 it reported 154 registers for pass C)."""


def launchable_maxnreg(num_warps: int) -> int:
    """The ``maxnreg`` of a num_warps launch: ``MAXNREG``, capped so that the block's registers fit
    ``BLOCK_REGISTERS`` (255 up to 8 warps: registers are allocated per warp in units of 256, so 255 per
    thread is 65536 per block at 8 warps; 128 at 16)."""
    return min(MAXNREG, BLOCK_REGISTERS // (32 * num_warps))


def landmark_grad_spec(m: int, e: int, kid: int, whiten: bool, conv: bool) -> dict:
    """Pass C's launch: one program per group, 8 warps with up to 255 registers each (the whole register file
    of a block). Its up to nine m×m products read their operands in k-chunks of BLOCK_K from memory: with whole
    (64, 64) operands in registers the whitened norms spilled up to 912 bytes at 16 warps and 255 registers (a
    block that could not launch anyway, ``BLOCK_REGISTERS``); chunked, 16 warps at 128 registers still spilled
    4–72 bytes at m = 64 on sm_80 and sm_90 (benchmarks/triton_aot.py --strict). e is walked in chunks of
    BLOCK_E <= 32 columns, d in chunks of BLOCK_D (8192 / BLOCK_M²: 32, 8, 2 at BLOCK_M = 16, 32, 64);
    nothing depends on d."""
    block_m = _p2(m)
    return dict(WHITEN=whiten, CONV=conv, KID=kid, BLOCK_M=block_m,
                BLOCK_E=min(_p2(e), 32), BLOCK_D=LANDMARK_GRAD_ELEMENTS // (block_m * block_m), BLOCK_K=16,
                num_warps=8, num_stages=1, maxnreg=launchable_maxnreg(8))


def pool_grad_spec(m: int, d: int) -> dict:
    """Pass E's launch: 32-row tiles, d in chunks of BLOCK_D <= 64 columns, 4 warps."""
    return dict(BLOCK_N=BLOCK_ROWS, BLOCK_M=_p2(m), BLOCK_D=min(_p2(d), 64), num_warps=4, num_stages=1,
                maxnreg=launchable_maxnreg(4))


def _launch(spec: dict) -> tuple[dict, dict]:
    opts = {k: spec[k] for k in _OPTIONS}
    return {k: v for k, v in spec.items() if k not in opts}, opts


def _groups(x: torch.Tensor, *tail: int) -> torch.Tensor:
    """x as a contiguous float32 (G, *tail) tensor (a view when it already is one)."""
    return x.reshape(-1, *tail).to(torch.float32).contiguous()


def _check(name: str, x, shape: tuple) -> None:
    if not isinstance(x, torch.Tensor) or tuple(x.shape) != tuple(shape):
        got = tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name}: expected shape {tuple(shape)}, got {got}")
    if x.dtype != torch.float32:
        raise ValueError(f"{name}: expected float32, got {x.dtype}")


def landmark_grad_triton(st, a: dict, b: dict | None, n: int, bandwidth: float, kernel: str, norm: str,
                         conv_weight: torch.Tensor | None = None, alpha: float = 1.0) -> dict:
    """Pass C (``backward_reference.landmark_grad``) from the partials of passes A and B, one launch.

    st: the float32 ``ForwardState`` (B, H, ·); a: pass A's partials {"pdm" (G, S, m, e), "pg" (G, S, e),
    "pdw" (G, S, 9, e) (with a conv, else None)}; b: pass B's {"pdsp" (G, S, m, m),
    "pdkt" (G, S, m)} for the whitened norms, else None; n the row count; conv_weight (H·e, 1, 3, 3) or None
    (any float dtype: only its shape is read); ``alpha`` the output scale α of the whitened norms
    (``limits.output_alpha``, 1 for the others: pass A's dM already carries it, q_const reads M = α W⁺ M').
    Returns {"d_mprime" (B, H, m, e), "q_cov" (B, H, m, m) (whiten, else None), "q_const", "k_const" (B, H, m),
    "v_const" (B, H, e), "d_marks" (B, H, m, d): dL through W, "dweight" (H·e, 1, 3, 3) and "dbias" (H·e,) (with
    conv_weight, else None)}, float32. ValueError naming the argument for what it does not serve."""
    bsz, h, m, d = st.marks.shape
    e = st.v_sum.shape[-1]
    why = unfit(norm, m, d, e, st.marks.dtype)
    if why is not None:
        raise ValueError(f"landmark_grad_triton: st: {why}")
    kid = triton_kernel_id("landmark_grad_triton", kernel)
    whiten, groups = whitens(norm), bsz * h
    alpha = check_alpha("landmark_grad_triton", norm, alpha)
    for name, x, shape in (("marks", st.marks, (bsz, h, m, d)), ("w", st.w, (bsz, h, m, m)),
                           ("w_inv", st.w_inv, (bsz, h, m, m)), ("cov", st.cov, (bsz, h, m, m)),
                           ("m_prime", st.m_prime, (bsz, h, m, e)), ("v_sum", st.v_sum, (bsz, h, e))):
        _check(f"landmark_grad_triton: st.{name}", x, shape)
    if not isinstance(a.get("pdm"), torch.Tensor) or a["pdm"].dim() != 4:
        raise ValueError("landmark_grad_triton: a['pdm']: expected pass A's (G, S, m, e) partials")
    splits = a["pdm"].shape[1]
    _check("landmark_grad_triton: a['pdm']", a["pdm"], (groups, splits, m, e))
    _check("landmark_grad_triton: a['pg']", a["pg"], (groups, splits, e))
    if whiten:
        if b is None:
            raise ValueError(f"landmark_grad_triton: b: norm {norm!r} whitens: pass B's partials are needed")
        # pass B walks the same splits as pass A (``limits.splits_for``)
        _check("landmark_grad_triton: b['pdsp']", b.get("pdsp"), (groups, splits, m, m))
        _check("landmark_grad_triton: b['pdkt']", b.get("pdkt"), (groups, splits, m))
    conv = conv_weight is not None
    if conv:  # only its shape is read: the gradients do not depend on the weight
        if not isinstance(conv_weight, torch.Tensor) or tuple(conv_weight.shape) != (h * e, 1, 3, 3):
            got = tuple(conv_weight.shape) if isinstance(conv_weight, torch.Tensor) else type(conv_weight).__name__
            raise ValueError(f"landmark_grad_triton: conv_weight: expected the depthwise 3×3 conv's "
                             f"{(h * e, 1, 3, 3)} for H·e = {h * e} channels, got {got}")
        _check("landmark_grad_triton: a['pdw'] (with conv_weight)", a.get("pdw"), (groups, splits, 9, e))
    dev = st.marks.device
    f32 = dict(dtype=torch.float32, device=dev)
    wi, w, cov = (_groups(x, m, m) for x in (st.w_inv, st.w, st.cov))
    marks, mp = _groups(st.marks, m, d), _groups(st.m_prime, m, e)
    v_sum = _groups(st.v_sum, e)
    pdm, pg = a["pdm"].contiguous(), a["pg"].contiguous()
    pdsp, pdkt = (b["pdsp"].contiguous(), b["pdkt"].contiguous()) if whiten else (pg, pg)  # placeholders: unread
    pdw = a["pdw"].contiguous() if conv else pg
    d_mprime = torch.empty(bsz, h, m, e, **f32)
    q_cov = torch.empty(bsz, h, m, m, **f32) if whiten else None
    q_const, k_const = torch.empty(bsz, h, m, **f32), torch.empty(bsz, h, m, **f32)
    v_const = torch.empty(bsz, h, e, **f32)
    d_marks = torch.empty(bsz, h, m, d, **f32)
    dweight = torch.empty(h * e, 1, 3, 3, **f32) if conv else None
    dbias = torch.empty(h * e, **f32) if conv else None
    meta, opts = _launch(landmark_grad_spec(m, e, kid, whiten, conv))
    work = torch.empty(groups, 4 * meta["BLOCK_M"] ** 2 + m * e, **f32)
    landmark_grad_kernel[(groups,)](wi, w, marks, cov, mp, v_sum, pdm, pg, pdsp, pdkt, pdw, work,
                                    d_mprime, q_const if q_cov is None else q_cov, q_const, k_const, v_const, d_marks,
                                    pg if dweight is None else dweight, pg if dbias is None else dbias,
                                    bsz, h, m, d, e, splits, float(n), -1.0 / float(bandwidth), alpha, **meta,
                                    **opts)
    return dict(d_mprime=d_mprime, q_cov=q_cov, q_const=q_const, k_const=k_const, v_const=v_const, d_marks=d_marks,
                dweight=dweight, dbias=dbias)


def pool_grad_triton(dq: torch.Tensor, d_marks_w: torch.Tensor, pdl: torch.Tensor | None, hw, grid) -> None:
    """Pass E (``backward_reference.pool_grad``) in place: dq (B, H, N, d) float32, float16 or bfloat16 (read, added
    to in float32, rounded to its dtype once), any batch, head and row strides with the last dim contiguous,
    += Pᵀ (d_marks_w + Σ_s pdl), d_marks_w (B, H, m, d), pdl (G, S, m, d) (pass D's partials, summed in split
    order; None: none), P the adaptive average pooling of the (gh, gw) = ``hw`` token grid to the (lh, lw) =
    ``grid`` landmark grid (hw None: a 1-D sequence, the (1, N) grid pooled to (1, grid)). ValueError naming
    the argument for what it does not serve."""
    if not isinstance(dq, torch.Tensor) or dq.dim() != 4 or dq.dtype not in LOAD_DTYPES or dq.stride(-1) != 1:
        raise ValueError("pool_grad_triton: dq: expected a float32, float16 or bfloat16 (B, H, N, d) tensor with a "
                         "contiguous last dim")
    bsz, h, n, d = dq.shape
    (gh, gw), (lh, lw) = ((1, n), (1, grid)) if hw is None else (hw, grid)
    m = lh * lw
    if gh * gw != n:
        raise ValueError(f"pool_grad_triton: hw={hw} is not a grid of the N={n} tokens")
    if lh < 1 or lw < 1:
        raise ValueError(f"pool_grad_triton: grid={grid} is not a landmark grid")
    why = unfit(None, m, d, 1, dq.dtype)
    if why is not None:
        raise ValueError(f"pool_grad_triton: grid: {why}")
    groups = bsz * h
    _check("pool_grad_triton: d_marks_w", d_marks_w, (bsz, h, m, d))
    if pdl is not None:
        if pdl.dim() != 4:
            raise ValueError("pool_grad_triton: pdl: expected pass D's (G, S, m, d) partials")
        _check("pool_grad_triton: pdl", pdl, (groups, pdl.shape[1], m, d))
    dlw = _groups(d_marks_w, m, d)
    parts, splits_l = (dlw, 0) if pdl is None else (pdl.contiguous(), pdl.shape[1])
    splits, rows = splits_for(n, groups)
    meta, opts = _launch(pool_grad_spec(m, d))
    pool_grad_kernel[(splits, groups)](dq, dq.stride(0), dq.stride(1), dq.stride(2), dlw, parts, h, n, m, d, gh, gw,
                                       lh, lw, rows, splits_l, **meta, **opts)


_INTS = {"B", "H", "M", "D", "E", "SPLITS", "sqb", "sqh", "sqn", "N", "GH", "GW", "LH", "LW", "rows_per_split",
         "SPLITS_L"}


def _signature(kernel, constexprs: dict, dtype: str = "fp32") -> dict:
    """Runtime arguments -> Triton types: sizes and strides i32, n, scale and alpha fp32, pass E's dq
    ``POINTER_TYPES[dtype]``, every other pointer fp32."""
    return {name: "i32" if name in _INTS else "fp32" if name in ("n", "scale", "alpha")
            else POINTER_TYPES[dtype] if name == "DQ" else "*fp32"
            for name in kernel.arg_names if name not in constexprs}


def _launches(m: int, e: int):
    """(kernel, spec, label) of every launch the launchers can make for m landmarks and e (pass C) or d (pass E)
    as powers of two (the specs depend on d only through pass E's BLOCK_D; pass C on e only through its
    column chunk, labelled ``ec``)."""
    for kid in sorted(TRITON_KERNEL_IDS):
        kind = f"dtype=fp32 kid={kid}"
        for norm in STREAMED_NORMS:
            inj = int(whitens(norm))
            for conv in (False, True):
                yield (landmark_grad_kernel, landmark_grad_spec(m, e, kid, whitens(norm), conv),
                       f"bwd_landmark_grad {kind} m={m} ec={min(e, 32)} inj={inj} norm={norm} conv={int(conv)}")
    yield pool_grad_kernel, pool_grad_spec(m, e), f"bwd_pool_grad dtype=fp32 m={m} d={e}"


def _half_launches(m: int, d: int, dtype: str):
    """Pass E's launch with a half dq (pass C reads no data tensor: it has float32 launches only)."""
    yield pool_grad_kernel, pool_grad_spec(m, d), f"bwd_pool_grad dtype={dtype} m={m} d={d}"


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label, options) ``landmark_grad_triton`` and
    ``pool_grad_triton`` can produce for m <= min(m_max, 64) and d, e <= min(d_max, 128), from the same ``*_spec``
    functions (benchmarks/triton_aot.py): m, d and e as powers of two (the specs see them only through
    ``next_power_of_2``), every streamed norm, every kernel family of the Triton profile, with and without the conv,
    and pass E for each dq
    dtype (labels ``dtype=fp32|fp16|bf16``, DQ typed so); identical specialisations are yielded once per dtype,
    under the label of their first launch."""
    sizes = [(m, e) for m in power_of_two_sizes(m_max, MAX_M) for e in power_of_two_sizes(d_max, MAX_D)]
    yield from distinct_launches((launch for m, e in sizes for launch in _launches(m, e)), _signature)
    for dtype in ("fp16", "bf16"):
        yield from distinct_launches([launch for m, d in sizes for launch in _half_launches(m, d, dtype)],
                                     partial(_signature, dtype=dtype))