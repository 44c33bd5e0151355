"""Pass D of the fused backward, the row pass, in Triton (docs/KERNELS.md, "The fused backward"): the
specification is ``backward_reference.row_grad_pass`` (pass D there) with its helpers ``_query_factor``,
``_key_row_grad``, ``kernel_rows_grad`` and ``value_conv_transpose_heads``.

``row_grad_kernel``, one launch, grid (splits, G): group g = b·H + h, its rows cut by ``limits.splits_for``,
each program walking its split in tiles of ``BLOCK_ROWS`` rows, every row both a query and a key:

- prologue: M = α W⁺ M' (m, e) (α the output scale of the whitened norms, docs/DESIGN.md §4.6, a runtime
  argument, 1 otherwise: applied once per (m, 16) chunk as M is stored, never per row) and pass C's dM'
  (m, e), S' + S'ᵀ and q_cov (m, m) (``whiten``: "injective"), c̄, k̄, q_const and k_const (m) into the
  program's work area (below);
- key side, per tile: C_k recomputed from k and the landmarks (C_q when K = Q), k̃ = C_k − k̄,
  u = v dM'ᵀ; with ``whiten`` P = k̃ (S' + S'ᵀ), s = ½ P·k̃ (= k̃ S' k̃ᵀ), r = (max(s, 0) + ε)^-½,
  ds = −½ r³ (k̃·u) [s ≥ 0], dk̃ = r u + ds P (else dk̃ = u, r = 1); dC_k = dk̃ + k_const;
  dv = (r k̃) dM' + v_const, with ``CONV`` plus the transpose of the layer's 3×3 depthwise conv applied to G
  (dv_i,j += Σ_t w[h·e + j, t] G_(i − off_t),j, off_t = dy·GW + dx, over the taps whose source row is inside
  the (GH, GW) grid), written to dv;
- query side: C_q, dC_q = G Mᵀ + q_const [+ (C_q − c̄) q_cov, ``whiten``];
- the kernel derivative: A = dC ∘ dk/dD (``_triton_common.factor_chain`` on the tile's ``kernel_factor``, dk/dD
  formed with the tile where it reads the distance D: −dC ∘ C / bandwidth for the Laplacian and the Gaussian;
  A_q + A_k in one matrix when K = Q),
  dx_i = Σ_l A_il sign(x_i − L_l) (squared L2 accumulation: 2 (x_i − L_l); sign(0) = 0) written to dq (and
  dk), and the rows' part of dL, dL_l −= Σ_i A_il sign(x_i − L_l), in chunks of ``BLOCK_D`` features.

Why it is laid out so (ptxas, ``benchmarks/triton_aot.py --strict``: one kernel at 8 warps and ``MAXNREG``
compiles without spills on sm_80 and sm_90; each simpler form below spilled, and 16 warps, which must stay
within 128 registers per thread, spilled more):

- Row tiles are held transposed, landmarks × rows (BLOCK_M, BLOCK_N), and the difference tiles ordered
  (BLOCK_D, BLOCK_M, BLOCK_N): the d chunk of the distance is then summed inside each thread (``_kernel_tile_dmn``,
  about 3 SASS instructions per (row, landmark, feature) with no shuffle, against 7.4 with 64 SHFL per chunk
  for the forward key pass's chunked transposed tile of the time, and 8 accumulator registers per thread
  against 32), and C, A and the
  gradient's tiles share one layout. The m × m products (S' + S'ᵀ, q_cov, IEEE on the FMA units) take the
  row tile as their right operand: the other way round their operand tables spilled 700+ bytes.
- e is walked in chunks of ``BLOCK_EC`` = 16 for the three row products with dM' and M ("tf32x3"): whole
  (m, e) operands of an MMA (their hi and lo parts) cost up to 128 registers per thread, and held across the
  tile loop they were staged in 248 KiB of shared memory. The most crowded specialisation, the whitened K = Q
  pass with the conv at m = 64, takes chunks of 8: with 16 it sat at 255 registers and spilled 4 bytes for
  matern32 (sm_90, float32); with 8, 213–215 registers, no spill, 36 KiB of shared memory instead of 40.
- M, dM', S' + S'ᵀ, q_cov and the (m) vectors live in the program's work area WORK (``_work_size`` floats,
  zero-padded to BLOCK_M × BLOCK_E / BLOCK_M × BLOCK_M), written once in the prologue and read per tile without
  masks at constant offsets: the masks and offsets of masked loads are loop-invariant, so the compiler
  hoisted them out of the tile loop, and holding them spilled. The reads hit L1/L2; the area is
  2·BLOCK_M·(BLOCK_E + BLOCK_M) + 5·BLOCK_M floats per program (97 KiB at m = 64, e = 128), allocated per call.
- The landmark gradient: an (m, d) accumulator cannot live in registers (a register tile cannot be indexed
  by a runtime d chunk, and a whole (64, 128) one spills), so each program owns its slab of pdl
  (G, splits, m, d) and adds each tile's part chunk by chunk, load-add-store. The first tile's load is masked
  off (reads 0), so the slab needs no zeroing pass; a CTA barrier closes each tile (and, for K ≠ Q, separates
  the query rows' pass over d from the key rows'), so that a chunk's stores are ordered before its next loads
  whichever threads of the (replicated) reduction layout issue them. The slab, at most 32 KiB per program,
  stays in L1/L2; storing A per row for a second walk over the rows would read q and k again. The caller sums
  the partials over the splits in split order: deterministic, no atomics.
- Known cost: the gradient's loop over d (``_rows_grad``) sums over the rows across the 32 lanes: at m = 64 (L1,
  sm_90) 583 SASS instructions per 4-feature chunk, 172 of them SHFL, for 32 (row, landmark, feature) triples
  per thread (648 with sign(diff) as a product; the selects saved the rest). A register-blocked
  (features, R, C, TN, TM) tile, each thread 2 rows × 4 landmarks as ``kernel.triton._distance`` blocks its
  accumulator, took 475 instructions and 96 SHFL per chunk in a kernel of that loop alone, where this layout
  took 567 and 172, but twice the CTA barriers (22 against 10, at one CTA of 8 warps per SM): not adopted
  without a GPU to time both.
- The data tensors (G, q, k, v, dq, dk, dv) are addressed as the kernel argument plus one int32 offset,
  group offset + row · row stride + column, summed before the pointer add: with group pointers (X + b·sxb +
  h·sxh, seven 64-bit values live through the tile loop) the bfloat16 variants at m = 64 with the conv and K ≠ Q
  spilled 4 bytes on sm_90 (one such pointer, stored once and reloaded per tile; norm "none", float16 and float32
  none), and so did the float32 injective ones once the loop was reordered (the query rows' part first, tried as
  a fix). Half data is converted right after each load, dq, dk, dv per chunk before their stores; α scales M once
  in the prologue, as each (m, 16) chunk of W⁺ M' is stored to the work area, so the tile loop reads the scaled
  M and carries nothing more. Every specialisation keeps 255 registers at most without a spill on sm_80 and
  sm_90 (float32 all, float16 and bfloat16 at m = 64); those at m = 64 with the conv sat at 255 before either.

Products: the row products with M and dM' "tf32x3", the m × m ones IEEE float32 (never plain TF32). q, k, v
and G are read in place through their (batch, head, row) strides (last dim contiguous), in their dtype
(float32, float16 or bfloat16, one per call: ``limits.LOAD_DTYPES``) and converted to float32 right after each
load, so every product and sum runs in float32; dq, dk, dv are written through theirs in the same dtype (head
views of one (B, N, 3C) gradient buffer of the qkv dtype serve), rounded once per element. The state, pass C's
outputs, the conv weight (cast to float32 by the launcher when it is not), the work area and pdl are float32.
m <= 64, d, e <= 128, no padding mask, no prefix tokens (``limits.unfit``). ``aot_specialisations`` lists every
launch configuration for ``benchmarks/triton_aot.py``, per data dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .._triton_common import distinct_launches, factor_chain, kernel_factor, kernel_value, power_of_two_sizes, sums_abs
from ..kernel.limits import TRITON_KERNEL_IDS
from .backward_stats_triton import POINTER_TYPES, check_alpha, dtype_name
from .limits import MAX_D, MAX_M, STREAMED_NORMS, splits_for, triton_kernel_id, unfit, whitens
from .triton import _square, config, split_rows_of


@triton.jit
def _rows_t(X, xoff, sxn, rn, ok, cols, D):
    """xᵀ for the tile's rows ``rn`` and the features ``cols``: (BLOCK_D, BLOCK_N) float32, 0 outside. X the
    tensor, xoff its group's offset b·sxb + h·sxh (int32), sxn its row stride."""
    x = tl.load(X + (xoff + rn[None, :] * sxn + cols[:, None]), mask=(cols[:, None] < D) & ok[None, :], other=0.0)
    return x.to(tl.float32)


@triton.jit
def _marks_t(Lg, rm, cols, M, D):
    """Lᵀ for the features ``cols``: (BLOCK_D, BLOCK_M), 0 outside."""
    return tl.load(Lg + rm[None, :] * D + cols[:, None], mask=(cols[:, None] < D) & (rm[None, :] < M), other=0.0)


@triton.jit
def _kernel_tile_dmn(X, xoff, sxn, Lg, rn, ok, M, D, scale, KID: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr):
    """(Cᵀ, Fᵀ): C = k(x_i, l_l) of family id KID (BLOCK_M, BLOCK_N), landmarks × rows, 0 outside rows ``ok`` and
    landmarks < M, and F its ``kernel_factor`` (dk/dD where the slope reads the distance D, else C itself): the
    transpose of ``triton._kernel_tile`` from (BLOCK_D, BLOCK_M, BLOCK_N) difference tiles, whose d chunk each
    thread sums itself (module docstring)."""
    rm = tl.arange(0, BLOCK_M)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        diff = _rows_t(X, xoff, sxn, rn, ok, cols, D)[:, None, :] - _marks_t(Lg, rm, cols, M, D)[:, :, None]
        if sums_abs(KID):
            acc += tl.sum(tl.abs(diff), axis=0)
        else:
            acc += tl.sum(diff * diff, axis=0)
    c = tl.where((rm[:, None] < M) & ok[None, :], kernel_value(acc, scale, KID), 0.0)
    return c, kernel_factor(acc, c, scale, KID)


@triton.jit
def _rows_grad(a_t, X, xoff, sxn, DX, dxoff, sdxn, Lg, slab, rn, ok, rm, accumulate, M, D, KID: tl.constexpr,
               BLOCK_D: tl.constexpr):
    """The vjp of C = k(X, L) for the tile's rows ``rn`` from Aᵀ = dL/dDᵀ (BLOCK_M, BLOCK_N) (``factor_chain``), in
    chunks of BLOCK_D features ((BLOCK_D, BLOCK_M, BLOCK_N) tiles): dx_i = Σ_l A_il sign(x_i − l_l) (squared
    L2: 2 (x_i − l_l); sign(0) = 0) written to DX (group offset dxoff, row stride sdxn) in its dtype, and
    −Σ_i A_il sign(x_i − l_l) added to the (M, D) slab (its old value read when ``accumulate``, else taken as 0).
    X (group offset xoff, row stride sxn) the rows read."""
    if not sums_abs(KID):
        a_t = 2.0 * a_t
    for d0 in range(0, D, BLOCK_D):
        cols = d0 + tl.arange(0, BLOCK_D)
        in_d = cols[:, None] < D
        diff = _rows_t(X, xoff, sxn, rn, ok, cols, D)[:, None, :] - _marks_t(Lg, rm, cols, M, D)[:, :, None]
        if sums_abs(KID):  # selects, not a product with sign(diff): 2 compares and 2 selects per element
            part = tl.where(diff > 0.0, a_t[None, :, :], tl.where(diff < 0.0, -a_t[None, :, :], 0.0))
        else:
            part = a_t[None, :, :] * diff
        tl.store(DX + (dxoff + rn[None, :] * sdxn + cols[:, None]), tl.sum(part, axis=1).to(DX.dtype.element_ty),
                 mask=in_d & ok[None, :])
        at = slab + rm[None, :] * D + cols[:, None]
        md = in_d & (rm[None, :] < M)
        tl.store(at, tl.load(at, mask=md & accumulate, other=0.0) - tl.sum(part, axis=2), mask=md)


@triton.jit
def _conv_transpose_chunk_t(dv_t, G, goff, sgn, CW, h, rn, ce, N, E, GH, GW):
    """dvᵀ (chunk × rows) + the transpose of the 3×3 depthwise conv applied to G for rows ``rn`` and head h's
    channels ``ce`` (< E): Σ_t w[h·E + j, t] · G[row − (dy·GW + dx), j] over the taps t = (dy + 1)·3 + (dx + 1)
    whose source row is inside the (GH, GW) grid (zero padding); G read at its group offset goff and row stride sgn, the
    weight CW (C, 1, 3, 3) (``triton._conv_tile``'s taps, each read at the mirrored neighbour)."""
    cols = ce < E
    gy = rn // GW
    gx = rn - gy * GW
    rows = rn < N
    for t in range(0, 9):  # a loop, not unrolled: one tap live at a time
        dy = t // 3 - 1
        dx = t % 3 - 1
        inside = rows & (gy - dy >= 0) & (gy - dy < GH) & (gx - dx >= 0) & (gx - dx < GW)
        g = tl.load(G + (goff + (rn - dy * GW - dx)[None, :] * sgn + ce[:, None]), mask=cols[:, None] & inside[None, :],
                    other=0.0)
        dv_t += g.to(tl.float32) * tl.load(CW + (h * E + ce) * 9 + t, mask=cols, other=0.0)[:, None]
    return dv_t


@triton.jit
def _own_times_rows_t(OWN, X, xoff, sxn, rn, ok, rm, rc, E, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_E: tl.constexpr, BLOCK_EC: tl.constexpr):
    """OWN Xᵀ (BLOCK_M, BLOCK_N), "tf32x3", over e in chunks of BLOCK_EC columns: OWN an (m, e) matrix of the
    program's work area (row stride BLOCK_E: dM' or M), X the data rows ``rn`` (valid ``ok``) at X + xoff with row
    stride sxn, read in their dtype and converted to float32 (u = v dM'ᵀ and G Mᵀ, transposed)."""
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for e0 in range(0, E, BLOCK_EC):
        ce = e0 + rc
        x_t = tl.load(X + (xoff + rn[None, :] * sxn + ce[:, None]), mask=(ce[:, None] < E) & ok[None, :], other=0.0)
        acc = tl.dot(tl.load(OWN + rm[:, None] * BLOCK_E + ce[None, :]), x_t.to(tl.float32), acc,
                     input_precision="tf32x3")
    return acc


@triton.jit
def row_grad_kernel(GRAD, sgb, sgh, sgn, Q, sqb, sqh, sqn, K, skb, skh, skn, V, svb, svh, svn,
                    L, WI, MP, CMEAN, KMEAN, SP, DMP, QCOV, QCONST, KCONST, VCONST, CW, GH, GW,
                    DQ, sdqb, sdqh, sdqn, DK, sdkb, sdkh, sdkn, DV, sdvb, sdvh, sdvn, PDL, WORK,
                    H, N, M, D, E, scale, eps, alpha, rows_per_split, SPLITS,
                    WHITEN: tl.constexpr, UNTIED: tl.constexpr, CONV: tl.constexpr, KID: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_EC: tl.constexpr):
    """Pass D for the rows of split program_id(0) of group program_id(1) (module docstring): dq, dk (UNTIED)
    and dv written, the split's part of dL into its slab of PDL (G, SPLITS, M, D); WORK (G, SPLITS,
    ``_work_size``) the programs' work areas. The row tiles are held transposed (landmarks × rows). GRAD, Q, K, V
    read in their dtype (float32, float16 or bfloat16) and converted after each load; DQ, DK, DV written in theirs;
    alpha the output scale α (M = α W⁺ M', scaled once in the prologue)."""
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    # the data tensors' group offsets (int32), added to the row offsets at each access (module docstring)
    goff, qoff, koff, voff = b * sgb + h * sgh, b * sqb + h * sqh, b * skb + h * skh, b * svb + h * svh
    dqoff, dkoff, dvoff = b * sdqb + h * sdqh, b * sdkb + h * sdkh, b * sdvb + h * sdvh
    Lg = L + g * M * D
    slab = PDL + (g * SPLITS + split) * M * D
    # the work area, zero-padded: M, dM' (BLOCK_M, BLOCK_E); S' + S'ᵀ, q_covᵀ (BLOCK_M, BLOCK_M); then c̄, k̄,
    # q_const, k_const (BLOCK_M each)
    m_own = WORK + (g * SPLITS + split) * (2 * BLOCK_M * BLOCK_E + 2 * BLOCK_M * BLOCK_M + 4 * BLOCK_M)
    dmp_own = m_own + BLOCK_M * BLOCK_E
    sp_own = dmp_own + BLOCK_M * BLOCK_E
    qcov_own = sp_own + BLOCK_M * BLOCK_M
    vec_own = qcov_own + BLOCK_M * BLOCK_M
    rm = tl.arange(0, BLOCK_M)
    rc = tl.arange(0, BLOCK_EC)
    inm = rm < M
    # prologue: the work area
    w_inv = _square(WI + g * M * M, M, BLOCK_M, False)
    for e0 in range(0, E, BLOCK_EC):
        me = inm[:, None] & (e0 + rc[None, :] < E)
        at = rm[:, None] * BLOCK_E + e0 + rc[None, :]
        mp = tl.load(MP + g * M * E + rm[:, None] * E + e0 + rc[None, :], mask=me, other=0.0)
        tl.store(m_own + at, tl.dot(w_inv, mp, input_precision="tf32x3") * alpha)  # M = α W⁺ M'
        tl.store(dmp_own + at, tl.load(DMP + g * M * E + rm[:, None] * E + e0 + rc[None, :], mask=me, other=0.0))
    if WHITEN:
        sq = rm[:, None] * BLOCK_M + rm[None, :]
        tl.store(sp_own + sq, _square(SP + g * M * M, M, BLOCK_M, False) + _square(SP + g * M * M, M, BLOCK_M, True))
        tl.store(qcov_own + sq, _square(QCOV + g * M * M, M, BLOCK_M, True))
    c_mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if WHITEN:
        c_mean = tl.load(CMEAN + g * M + rm, mask=inm, other=0.0)
    tl.store(vec_own + rm, c_mean)
    tl.store(vec_own + BLOCK_M + rm, tl.load(KMEAN + g * M + rm, mask=inm, other=0.0))
    tl.store(vec_own + 2 * BLOCK_M + rm, tl.load(QCONST + g * M + rm, mask=inm, other=0.0))
    tl.store(vec_own + 3 * BLOCK_M + rm, tl.load(KCONST + g * M + rm, mask=inm, other=0.0))
    tl.debug_barrier()  # the work area stored before any thread reads it back
    lo, row_end = split_rows_of(split, rows_per_split)
    for n0 in range(lo, row_end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = (rn < N) & (rn < row_end)
        # key side: dC_k = dk̃ + k_const, dk̃ = r u + ds k̃ (S' + S'ᵀ) (whiten) or u, u = v dM'ᵀ. Rows outside
        # ``ok`` and landmarks >= M keep finite values that meet C = 0 in A (every slope is a multiple of C), so
        # nothing else is masked.
        ck_t, fk_t = _kernel_tile_dmn(K, koff, skn, Lg, rn, ok, M, D, scale, KID, BLOCK_N, BLOCK_M, BLOCK_D)
        kt_t = ck_t - tl.load(vec_own + BLOCK_M + rm)[:, None]
        u_t = _own_times_rows_t(dmp_own, V, voff, svn, rn, ok, rm, rc, E, BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EC)
        if WHITEN:
            p_t = tl.dot(tl.load(sp_own + rm[:, None] * BLOCK_M + rm[None, :]), kt_t, input_precision="ieee")
            s = 0.5 * tl.sum(p_t * kt_t, axis=0)  # = k̃ S' k̃ᵀ
            r = 1.0 / tl.sqrt(tl.maximum(s, 0.0) + eps)
            ds = tl.where(s >= 0.0, -0.5 * r * r * r * tl.sum(kt_t * u_t, axis=0), 0.0)
            dck_t = r[None, :] * u_t + ds[None, :] * p_t
            kt_t = kt_t * r[None, :]
        else:
            dck_t = u_t
        # Aᵀ of the key side
        ak_t = factor_chain(dck_t + tl.load(vec_own + 3 * BLOCK_M + rm)[:, None], fk_t, scale, KID, True)
        # dvᵀ = dM'ᵀ (r k̃)ᵀ + v_const [+ the conv's transpose of G], in chunks of e
        for e0 in range(0, E, BLOCK_EC):
            ce = e0 + rc
            cols = ce < E
            dv_t = tl.dot(tl.load(dmp_own + rm[None, :] * BLOCK_E + ce[:, None]), kt_t, input_precision="tf32x3") \
                + tl.load(VCONST + g * E + ce, mask=cols, other=0.0)[:, None]
            if CONV:
                dv_t = _conv_transpose_chunk_t(dv_t, GRAD, goff, sgn, CW, h, rn, ce, N, E, GH, GW)
            tl.store(DV + (dvoff + rn[None, :] * sdvn + ce[:, None]), dv_t.to(DV.dtype.element_ty),
                     mask=cols[:, None] & ok[None, :])
        # query side: dC_q = G Mᵀ + q_const [+ (C_q − c̄) q_cov]
        if UNTIED:
            cq_t, fq_t = _kernel_tile_dmn(Q, qoff, sqn, Lg, rn, ok, M, D, scale, KID, BLOCK_N, BLOCK_M, BLOCK_D)
        else:
            cq_t, fq_t = ck_t, fk_t
        dcq_t = _own_times_rows_t(m_own, GRAD, goff, sgn, rn, ok, rm, rc, E, BLOCK_M, BLOCK_N, BLOCK_E, BLOCK_EC)
        dcq_t += tl.load(vec_own + 2 * BLOCK_M + rm)[:, None]
        if WHITEN:
            dcq_t += tl.dot(tl.load(qcov_own + rm[:, None] * BLOCK_M + rm[None, :]),
                            cq_t - tl.load(vec_own + rm)[:, None], input_precision="ieee")
        # the kernel derivative: Aᵀ = (dC ∘ dk/dD)ᵀ -> dq (dk) and the program's slab of dL
        aq_t = factor_chain(dcq_t, fq_t, scale, KID, True)
        if UNTIED:
            _rows_grad(aq_t, Q, qoff, sqn, DQ, dqoff, sdqn, Lg, slab, rn, ok, rm, n0 > lo, M, D, KID, BLOCK_D)
            tl.debug_barrier()  # the query rows' slab stores before the key rows' loads
            _rows_grad(ak_t, K, koff, skn, DK, dkoff, sdkn, Lg, slab, rn, ok, rm, True, M, D, KID, BLOCK_D)
        else:
            _rows_grad(aq_t + ak_t, Q, qoff, sqn, DQ, dqoff, sdqn, Lg, slab, rn, ok, rm, n0 > lo, M, D, KID, BLOCK_D)
        tl.debug_barrier()  # this tile's slab stores before the next tile's loads


def row_grad_spec(m: int, d: int, e: int, kid: int, whiten: bool, untied: bool, conv: bool) -> dict:
    """Constexprs and launch options of ``row_grad_kernel`` for m landmarks, head dim d, value dim e: the
    forward passes' ``config`` (BLOCK_ROWS rows, 8 warps) with BLOCK_D from m (``DIFFERENCE_ELEMENTS``: no tile
    depends on d) in place of their distance loop's unrolling."""
    cfg = config(m, d, e)
    cfg.pop("KU")
    crowded = whiten and conv and not untied and cfg["BLOCK_M"] == MAX_M
    return dict(WHITEN=whiten, UNTIED=untied, CONV=conv, KID=kid, BLOCK_EC=8 if crowded else 16,
                BLOCK_D=DIFFERENCE_ELEMENTS // (cfg["BLOCK_N"] * cfg["BLOCK_M"]), **cfg)


DIFFERENCE_ELEMENTS = 8192
"""Elements of pass D's (BLOCK_D, BLOCK_M, BLOCK_N) difference tiles (32 per thread at 8 warps): BLOCK_D = 16, 8,
4 features at BLOCK_M = 16, 32, 64."""

_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _launch(spec: dict) -> tuple[dict, dict]:
    opts = {k: spec[k] for k in _OPTIONS}
    return {k: v for k, v in spec.items() if k not in opts}, opts


def _work_size(meta: dict) -> int:
    """Floats of one program's work area: M and dM' (BLOCK_M, BLOCK_E), S' + S'ᵀ and q_covᵀ (BLOCK_M, BLOCK_M),
    c̄, k̄, q_const, k_const and b (BLOCK_M each)."""
    bm = meta["BLOCK_M"]
    return 2 * bm * meta["BLOCK_E"] + 2 * bm * bm + 4 * bm


MAX_OFFSET = 2 ** 31 - 1
"""Largest element offset of a data tensor the kernel addresses (int32: group + row + column offset, summed
before the pointer add; module docstring)."""


def _span(x: torch.Tensor) -> int:
    """The largest element offset of x from its data pointer."""
    return sum((size - 1) * stride for size, stride in zip(x.shape, x.stride()) if size > 0)


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def _f32(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.float32).contiguous()


def _check_out(name: str, t: torch.Tensor, shape: tuple, dtype: torch.dtype, device) -> None:
    if not isinstance(t, torch.Tensor) or tuple(t.shape) != shape:
        got = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
        raise ValueError(f"row_grad_triton: {name}: expected a {shape} output, got {got}")
    if t.dtype != dtype or t.device != device or t.stride(-1) != 1:
        raise ValueError(f"row_grad_triton: {name}: expected {dtype_name(dtype)} (the inputs' dtype) on {device} "
                         f"with a contiguous last dim, got {t.dtype} on {t.device}, strides {t.stride()}")


def row_grad_triton(grad: torch.Tensor, qs: torch.Tensor, ks: torch.Tensor, vv: torch.Tensor, st, c: dict,
                    bandwidth: float, kernel: str, norm: str, eps: float, conv, dq: torch.Tensor,
                    dk: torch.Tensor | None, dv: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    """Pass D (``backward_reference.row_grad_pass``) in one launch. grad (B, H, N, e), qs, ks (B, H, N, d)
    (``ks is qs`` when K = Q), vv (B, H, N, e): float32, float16 or bfloat16 (one dtype, read as such, every sum in
    float32) views with a contiguous last dim (others are copied);
    st the ``ForwardState`` (float32, contiguous (B, H, ·)); c pass C's dict (``landmark_grad``: "d_mprime",
    "q_cov" (None unless the norm whitens), "q_const", "k_const", "v_const"); conv an
    ``ops.value_conv.ValueConv`` (its weight (H·e, 1, 3, 3), any float dtype, read as float32, and hw; tokens
    unused) or None; ``alpha`` the output scale α of the whitened norms (``limits.output_alpha``, 1 for the others:
    M = α W⁺ M'). Writes dq, dk (None when ``ks is qs``: dq then gets the whole gradient of the one factor)
    (B, H, N, d) and dv (B, H, N, e), preallocated views in the inputs' dtype with a contiguous last dim (any
    other strides), for every row. Returns pdl
    (G, splits, m, d) float32, G = B·H: per (group, split) the rows' part of dL, summed over the splits in
    order equal to row_grad_pass's "d_marks". ValueError naming the argument for what it does not serve."""
    if qs.dim() != 4 or vv.dim() != 4:
        raise ValueError(f"row_grad_triton: qs, vv: expected (B, H, N, ·), got {tuple(qs.shape)}, {tuple(vv.shape)}")
    b, h, n, d = qs.shape
    e, m = vv.shape[-1], st.marks.shape[-2]
    if tuple(st.marks.shape) != (b, h, m, d):
        raise ValueError(f"row_grad_triton: st: landmarks {tuple(st.marks.shape)}, expected (B, H, m, d) = "
                         f"({b}, {h}, m, {d})")
    why = unfit(norm, m, d, e, qs.dtype)
    if why is not None:
        raise ValueError(f"row_grad_triton: {why}")
    whiten, untied, groups = whitens(norm), ks is not qs, b * h
    kid = triton_kernel_id("row_grad_triton", kernel)
    for name, t, shape in (("grad", grad, (b, h, n, e)), ("ks", ks, (b, h, n, d)), ("vv", vv, (b, h, n, e))):
        if tuple(t.shape) != shape or t.dtype != qs.dtype:
            raise ValueError(f"row_grad_triton: {name}: expected {dtype_name(qs.dtype)} (qs's dtype) {shape}, got "
                             f"{t.dtype} {tuple(t.shape)}")
    if (dk is None) == untied:
        raise ValueError("row_grad_triton: dk: expected None exactly when ks is qs (K = Q)")
    _check_out("dq", dq, (b, h, n, d), qs.dtype, qs.device)
    _check_out("dv", dv, (b, h, n, e), qs.dtype, qs.device)
    if untied:
        _check_out("dk", dk, (b, h, n, d), qs.dtype, qs.device)
    alpha = check_alpha("row_grad_triton", norm, alpha)
    if whiten and c.get("q_cov") is None:
        raise ValueError(f"row_grad_triton: c: norm {norm!r} whitens, c['q_cov'] is None")
    gh, gw = 1, n
    if conv is not None:
        if conv.weight.device != qs.device:
            raise ValueError(f"row_grad_triton: conv: weight on {conv.weight.device}, the rows on {qs.device}")
        if tuple(conv.weight.shape) != (h * e, 1, 3, 3):
            raise ValueError(f"row_grad_triton: conv: expected a (H·e, 1, 3, 3) = ({h * e}, 1, 3, 3) depthwise "
                             f"weight, got {tuple(conv.weight.shape)}")
        if conv.hw is not None:
            gh, gw = conv.hw
            if gh * gw != n:
                raise ValueError(f"row_grad_triton: conv: hw={conv.hw} is not a grid of the N={n} tokens")
    gr, q, v = _rows_contiguous(grad), _rows_contiguous(qs), _rows_contiguous(vv)
    k = _rows_contiguous(ks) if untied else q
    dk_ = dk if untied else dq  # placeholder: UNTIED=False writes no dk
    for name, t in (("grad", gr), ("qs", q), ("ks", k), ("vv", v), ("dq", dq), ("dk", dk_), ("dv", dv)):
        if _span(t) > MAX_OFFSET:
            raise ValueError(f"row_grad_triton: {name}: its elements span {_span(t)} > {MAX_OFFSET}, past the "
                             "kernel's int32 offsets")
    lm, wi, mp = _f32(st.marks), _f32(st.w_inv), _f32(st.m_prime)
    cmean, kmean, sp = _f32(st.c_mean), _f32(st.k_mean), _f32(st.sp)
    dmp, qconst, kconst, vconst = _f32(c["d_mprime"]), _f32(c["q_const"]), _f32(c["k_const"]), _f32(c["v_const"])
    qcov = _f32(c["q_cov"]) if whiten else sp  # placeholder without whiten (unread)
    cw = _f32(conv.weight) if conv is not None else vconst  # placeholder without a conv (unread)
    splits, rows = splits_for(n, groups)
    pdl = torch.empty(groups, splits, m, d, dtype=torch.float32, device=q.device)
    meta, opts = _launch(row_grad_spec(m, d, e, kid, whiten, untied, conv is not None))
    work = torch.empty(groups, splits, _work_size(meta), dtype=torch.float32, device=q.device)
    row_grad_kernel[(splits, groups)](
        gr, gr.stride(0), gr.stride(1), gr.stride(2), q, q.stride(0), q.stride(1), q.stride(2),
        k, k.stride(0), k.stride(1), k.stride(2), v, v.stride(0), v.stride(1), v.stride(2),
        lm, wi, mp, cmean, kmean, sp, dmp, qcov, qconst, kconst, vconst, cw, gh, gw,
        dq, dq.stride(0), dq.stride(1), dq.stride(2), dk_, dk_.stride(0), dk_.stride(1), dk_.stride(2),
        dv, dv.stride(0), dv.stride(1), dv.stride(2), pdl, work,
        h, n, m, d, e, -1.0 / float(bandwidth), float(eps), alpha, rows, splits, **meta, **opts)
    return pdl


_INTS = {"sgb", "sgh", "sgn", "sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "GH", "GW",
         "sdqb", "sdqh", "sdqn", "sdkb", "sdkh", "sdkn", "sdvb", "sdvh", "sdvn", "H", "N", "M", "D", "E",
         "rows_per_split", "SPLITS"}


DATA = {"GRAD", "Q", "K", "V", "DQ", "DK", "DV"}
"""The pointers of the data tensors (read: grad, q, k, v; written: dq, dk, dv), typed by the inputs' dtype."""


def _signature(constexprs: dict, dtype: str = "fp32") -> dict:
    """Runtime arguments -> Triton types: sizes and strides i32, scale, eps and alpha fp32, the data pointers
    ``POINTER_TYPES[dtype]``, every other pointer (state, pass C's outputs, the conv weight, pdl, work) fp32."""
    return {name: "i32" if name in _INTS else "fp32" if name in ("scale", "eps", "alpha")
            else POINTER_TYPES[dtype] if name in DATA else "*fp32"
            for name in row_grad_kernel.arg_names if name not in constexprs}


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label, options) ``row_grad_triton`` can
    produce for m <= min(m_max, 64), e <= min(d_max, 128) and any d <= 128, from ``row_grad_spec`` (the
    launcher's): the streamed norms × the kernel families of the Triton profile × K = Q / K ≠ Q × conv or not × m, e
    as powers of two (the
    spec depends on them only through ``next_power_of_2``, and not on d) × the data dtype (float32, then float16
    and bfloat16: labels ``dtype=fp32|fp16|bf16``, the data pointers typed so). Identical specialisations are
    yielded once per dtype, under the label of their first launch."""
    for dtype in POINTER_TYPES:
        yield from distinct_launches(_launches(m_max, d_max, dtype), lambda kernel, meta, t=dtype: _signature(meta, t))


def _launches(m_max: int, d_max: int, dtype: str = "fp32"):
    """(kernel, spec, label) of every launch ``row_grad_triton`` can make with data of ``dtype``
    (``aot_specialisations``)."""
    for m in power_of_two_sizes(m_max, MAX_M):
        for e in power_of_two_sizes(d_max, MAX_D):
            for kid in sorted(TRITON_KERNEL_IDS):
                for norm in STREAMED_NORMS:
                    whiten = whitens(norm)
                    for untied in (False, True):
                        for conv in (False, True):
                            label = (f"bwd_rows dtype={dtype} kid={kid} m={m} e={e} norm={norm} "
                                     f"inj={int(whiten)} untied={int(untied)} conv={int(conv)}")
                            yield row_grad_kernel, row_grad_spec(m, MAX_D, e, kid, whiten, untied, conv), label
