"""The streaming Nyström passes in Triton (docs/KERNELS.md, "The streaming passes"): C_q and C_k are
recomputed from q, k and the landmarks inside each pass and never stored; the specification, pass by
pass, is ``reference.py`` (docstring there), the formulas docs/DESIGN.md §4.3–§4.4 with the masking of §2.5.

Per (batch, head) group g = b·H + h, rows cut into the splits of ``limits.splits_for`` (grid (splits, G)
for the passes; each program walks its split in tiles of ``BLOCK_ROWS`` rows):

- ``query_stats_kernel`` (pass 1): per split the valid-row count, the
  shift p (mean of the first tile), Σ (c − p), with ``WHITEN`` Σ (c − p)ᵀ (c − p), for K ≠ Q Σ C_k;
- ``combine_kernel`` (grid (G,)): the pass-1 partials summed in split order into n, c̄, k̄ and
  S' = W⁺ᵀ S W⁺ (two m×m products). Its own kernel: as a prologue of the key pass, its products next to
  the key pass's made that kernel spill registers on sm_80 (KERNELS.md);
- ``key_pass_kernel`` (pass 2): per key tile C_k (rows × landmarks), k̃, s_j = k̃_j S' k̃_jᵀ (from
  k̃ S'), r_j, and per split the partials of M' = Σ r_j k̃_jᵀ v_j (the tile transposed into the product)
  and Σ v;
- ``output_kernel`` (pass 3): prologue M = α W⁺ Σ M' (α = n^-p, the output scale of the whitened norms,
  docs/DESIGN.md §4.6, computed on the device from the group's valid count n; p = 0: α = 1 exactly), v̄;
  per query tile C_q, out = (c − c̄) M + v̄ ("inline": c M + v̄), written straight into a
  (B, N, H, e) buffer (the heads merged: the caller gets its (B, H, N, e) view, whose
  ``transpose(1, 2).reshape(B, N, H·e)`` is free). With ``CONV``
  (the layer's DWConv(V), docs/DESIGN.md §4.5) each tile also gets bias + the 9 taps of the 3×3 depthwise
  weight on the tile's grid neighbours in V (read through V's row stride, masked at the (GH, GW) grid's
  borders), so the buffer is the layer's (B, N, C) "heads + DWConv(V)".

Partials go to float32 workspaces (G, splits, ·), summed in a fixed order by the next kernel:
deterministic, no atomics. Every C tile is k(dist) of the kernel family (the constexpr ``KID``, its profile
``_triton_common.kernel_value`` applied after the distance loop: exp(−dist / bandwidth) for the Laplacian and
the Gaussian), the distance summed in a register-blocked loop over single features, each thread adding one
feature of its 2 rows × BLOCK_M / 16 landmarks per step (``_kernel_tile``: no warp shuffles, ``DISTANCE_LOOPS``;
the backward's passes A and B use it too). Products:
the m×m ones and k̃ S' IEEE float32, the Gram and output products "tf32x3" (never
plain TF32: the variances must keep float32 bits). q, k, v are read in place through their (batch, head,
row) strides (last dim contiguous), in their dtype (float32, float16 or bfloat16, ``limits.LOAD_DTYPES``:
converted to float32 right after each load; the output is written in v's dtype, every workspace and
statistic is float32); a padding mask is a runtime argument (without one, a single 0 byte read with
stride 0).

Forward only, the streamed norms (``limits.STREAMED_NORMS``: ``WHITEN`` for "injective", not for "inline"; the
ablation norms run the step path), m <= 64, d, e <= 128 (``limits.unfit``). ``aot_specialisations`` lists every launch
configuration for ``benchmarks/triton_aot.py``, per input dtype.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..kernel.limits import TRITON_KERNEL_IDS
from ..kernel.triton import _distance_strided, _unblock
from .._triton_common import distinct_launches, kernel_value, power_of_two_sizes, product_from_memory
from .limits import (BLOCK_ROWS, LOAD_DTYPES, MAX_D, MAX_M, STREAMED_NORMS, conv_unfit, splits_for, triton_kernel_id,
                     unfit, whitens)


@triton.jit
def _valid_rows(MASK, smb, b, rn, row_end, N):
    """Rows ``rn`` inside the split (< row_end), the sequence (< N) and not padded: MASK (B, N) u8 with batch
    stride smb (without a mask, one 0 byte and smb = 0, read for every row: one mask load instead of a
    constexpr that would double the specialisations)."""
    ok = (rn < N) & (rn < row_end)
    pad = tl.load(MASK + b * smb + rn * tl.minimum(smb, 1), mask=ok, other=1)
    return ok & (pad == 0)


@triton.jit
def split_rows_of(split, rows_per_split):
    """(first row, end row) of row split ``split`` of a group (``limits.splits_for``: ``rows_per_split`` rows each,
    the last split cut at N by the passes' row masks)."""
    lo = split * rows_per_split
    return lo, lo + rows_per_split


SIDE = tl.constexpr(16)
"""Threads per side of ``_kernel_tile``'s thread grid: SIDE × SIDE = 256, the passes' 8 warps (``config``)."""


@triton.jit
def _kernel_tile(X, sxn, Lg, n0, ok, N, M, D, scale, KID: tl.constexpr, BLOCK_N: tl.constexpr,
                 BLOCK_M: tl.constexpr, KU: tl.constexpr):
    """k(x_i, l_j) of family id KID (scale = −1 / bandwidth) for rows i = n0 .. n0 + BLOCK_N of X (row stride
    sxn, features contiguous) and the M landmarks at Lg (M, D): (BLOCK_N, BLOCK_M), 0 outside rows ``ok`` and
    columns < M. The distance
    is ``kernel.triton._distance_strided``'s register-blocked loop over single features on a SIDE × SIDE
    thread grid, each thread BLOCK_N / SIDE rows × BLOCK_M / SIDE landmarks (2 × 4 at m = 64), no shuffles;
    rows past N and landmarks past M read the last one and are zeroed here."""
    rm = tl.arange(0, BLOCK_M)
    d = _distance_strided(X, sxn, Lg, D, n0, 0, N, M, D, KID, BLOCK_N // SIDE, BLOCK_M // SIDE, SIDE, SIDE, KU)
    c = kernel_value(_unblock(d, BLOCK_N // SIDE, BLOCK_M // SIDE, SIDE, SIDE), scale, KID)
    return tl.where(ok[:, None] & (rm[None, :] < M), c, 0.0)


@triton.jit
def _query_tile(Qg, sqn, Lg, MASK, smb, b, n0, row_end, N, M, D, scale, shift, count, a, gram,
                WHITEN: tl.constexpr, KID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                KU: tl.constexpr):
    """Pass 1's sums plus the tile of rows n0 .. n0 + BLOCK_N."""
    rn = n0 + tl.arange(0, BLOCK_N)
    ok = _valid_rows(MASK, smb, b, rn, row_end, N)
    rm = tl.arange(0, BLOCK_M)
    c = _kernel_tile(Qg, sqn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU)
    d = tl.where(ok[:, None] & (rm[None, :] < M), c - shift[None, :], 0.0)
    count += tl.sum(ok.to(tl.float32), axis=0)
    a += tl.sum(d, axis=0)
    if WHITEN:
        gram += tl.dot(tl.trans(d), d, input_precision="tf32x3")
    return count, a, gram


@triton.jit
def query_stats_kernel(Q, sqb, sqh, sqn, K, skb, skh, skn, L, MASK, smb, PCOUNT, PSHIFT, PSUM, PGRAM, PKSUM,
                       H, N, M, D, scale, rows_per_split, SPLITS,
                       WHITEN: tl.constexpr, UNTIED: tl.constexpr, KID: tl.constexpr,
                       BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KU: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    Qg, Kg, Lg = Q + b * sqb + h * sqh, K + b * skb + h * skh, L + g * M * D
    rm = tl.arange(0, BLOCK_M)
    lo, row_end = split_rows_of(split, rows_per_split)
    # the shift: mean of the split's first tile of valid rows
    rn = lo + tl.arange(0, BLOCK_N)
    ok = _valid_rows(MASK, smb, b, rn, row_end, N)
    first = tl.sum(_kernel_tile(Qg, sqn, Lg, lo, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU), axis=0)
    shift = first / tl.maximum(tl.sum(ok.to(tl.float32), axis=0), 1.0)
    count = tl.sum(tl.zeros((BLOCK_N,), dtype=tl.float32), axis=0)
    a = tl.zeros((BLOCK_M,), dtype=tl.float32)
    gram = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    for n0 in range(lo, row_end, BLOCK_N):
        count, a, gram = _query_tile(Qg, sqn, Lg, MASK, smb, b, n0, row_end, N, M, D, scale, shift, count, a, gram,
                                     WHITEN, KID, BLOCK_N, BLOCK_M, KU)
    ksum = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if UNTIED:  # Σ C_k in a loop of its own (in the loop above, the second tile spilled registers on sm_90)
        for n0 in range(lo, row_end, BLOCK_N):
            rn = n0 + tl.arange(0, BLOCK_N)
            ok = _valid_rows(MASK, smb, b, rn, row_end, N)
            ksum += tl.sum(_kernel_tile(Kg, skn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU), axis=0)
    part = g * SPLITS + split
    tl.store(PCOUNT + part, count)
    tl.store(PSHIFT + part * M + rm, shift, mask=rm < M)
    tl.store(PSUM + part * M + rm, a, mask=rm < M)
    if WHITEN:
        tl.store(PGRAM + part * M * M + rm[:, None] * M + rm[None, :], gram, mask=(rm[:, None] < M) & (rm[None, :] < M))
    if UNTIED:
        tl.store(PKSUM + part * M + rm, ksum, mask=rm < M)


@triton.jit
def _query_means(PCOUNT, PSHIFT, PSUM, g, M, SPLITS, BLOCK_M: tl.constexpr):
    """(n, c̄) from pass 1's partials, summed in split order."""
    rm = tl.arange(0, BLOCK_M)
    n = tl.sum(tl.zeros((BLOCK_M,), dtype=tl.float32), axis=0)
    total = tl.zeros((BLOCK_M,), dtype=tl.float32)
    for s in range(0, SPLITS):
        part = g * SPLITS + s
        cnt = tl.load(PCOUNT + part)
        n += cnt
        total += cnt * tl.load(PSHIFT + part * M + rm, mask=rm < M, other=0.0) \
            + tl.load(PSUM + part * M + rm, mask=rm < M, other=0.0)
    n = tl.maximum(n, 1.0)
    return n, total / n


@triton.jit
def _square(P, M, BLOCK_M: tl.constexpr, TRANSPOSE: tl.constexpr):
    """The (M, M) row-major matrix at P (transposed with TRANSPOSE) as a (BLOCK_M, BLOCK_M) tile, 0 outside."""
    rm = tl.arange(0, BLOCK_M)
    inside = (rm[:, None] < M) & (rm[None, :] < M)
    if TRANSPOSE:
        return tl.load(P + rm[None, :] * M + rm[:, None], mask=inside, other=0.0)
    return tl.load(P + rm[:, None] * M + rm[None, :], mask=inside, other=0.0)


@triton.jit
def combine_kernel(PCOUNT, PSHIFT, PSUM, PGRAM, PKSUM, WI, NCOUNT, CMEAN, KMEAN, SP, COV, M, SPLITS,
                   WHITEN: tl.constexpr, UNTIED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr):
    """Pass 1's partials of group program_id(0), summed in split order: n, c̄, k̄ and S' = W⁺ᵀ S W⁺ with
    S = Σ_s [G_s + a_s δ_sᵀ + δ_s a_sᵀ + n_s δ_s δ_sᵀ] / n, δ_s = p_s − c̄ (``reference.combine_queries``).
    A kernel of its own: its m×m products next to the key pass's row and Gram products spilled registers.
    With ``WHITEN`` S is stored at COV (the backward's ``ForwardState.cov``) and the two products read their
    operands from memory in chunks of BLOCK_K (``_triton_common.product_from_memory``; S W⁺ goes to the group's
    first Gram partial, already summed): whole (64, 64) operands in registers spilled at 8 warps, and 16 warps
    at 255 registers exceed a block's register file (no launch)."""
    g = tl.program_id(0)
    rm = tl.arange(0, BLOCK_M)
    n, c_mean = _query_means(PCOUNT, PSHIFT, PSUM, g, M, SPLITS, BLOCK_M)
    tl.store(NCOUNT + g, n)
    tl.store(CMEAN + g * M + rm, c_mean, mask=rm < M)
    if UNTIED:
        k_mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
        for s in range(0, SPLITS):
            k_mean += tl.load(PKSUM + (g * SPLITS + s) * M + rm, mask=rm < M, other=0.0)
        tl.store(KMEAN + g * M + rm, k_mean / n, mask=rm < M)
    else:
        tl.store(KMEAN + g * M + rm, c_mean, mask=rm < M)
    if WHITEN:
        cov = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
        for s in range(0, SPLITS):
            part = g * SPLITS + s
            cnt = tl.load(PCOUNT + part)
            delta = tl.where(rm < M, tl.load(PSHIFT + part * M + rm, mask=rm < M, other=0.0) - c_mean, 0.0)
            a = tl.load(PSUM + part * M + rm, mask=rm < M, other=0.0)
            cov += _square(PGRAM + part * M * M, M, BLOCK_M, False) + a[:, None] * delta[None, :] \
                + delta[:, None] * (a + cnt * delta)[None, :]
        cov = cov / n
        inside = (rm[:, None] < M) & (rm[None, :] < M)
        tl.store(COV + g * M * M + rm[:, None] * M + rm[None, :], cov, mask=inside)
        tl.debug_barrier()
        # S' = W⁺ᵀ (S W⁺), both products from memory in k-chunks; S W⁺ in the group's first Gram slot (read above)
        wi, sw_slot = WI + g * M * M, PGRAM + g * SPLITS * M * M
        sw = product_from_memory(COV + g * M * M, M, 1, wi, M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        tl.store(sw_slot + rm[:, None] * M + rm[None, :], sw, mask=inside)
        tl.debug_barrier()
        sp = product_from_memory(wi, 1, M, sw_slot, M, 1, M, M, M, BLOCK_M, BLOCK_M, BLOCK_K)
        tl.store(SP + g * M * M + rm[:, None] * M + rm[None, :], sp, mask=inside)


@triton.jit
def key_pass_kernel(K, skb, skh, skn, V, svb, svh, svn, L, MASK, smb, KMEAN, SP, PM, PV,
                    H, N, M, D, E, scale, eps, rows_per_split, SPLITS,
                    WHITEN: tl.constexpr, KID: tl.constexpr,
                    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KU: tl.constexpr, BLOCK_E: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    Kg, Vg, Lg = K + b * skb + h * skh, V + b * svb + h * svh, L + g * M * D
    rm = tl.arange(0, BLOCK_M)
    re = tl.arange(0, BLOCK_E)
    sp = tl.zeros((BLOCK_M, BLOCK_M), dtype=tl.float32)
    k_mean = tl.load(KMEAN + g * M + rm, mask=rm < M, other=0.0)
    if WHITEN:
        sp = _square(SP + g * M * M, M, BLOCK_M, False)
    acc = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    vsum = tl.zeros((BLOCK_E,), dtype=tl.float32)
    lo, row_end = split_rows_of(split, rows_per_split)
    for n0 in range(lo, row_end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = _valid_rows(MASK, smb, b, rn, row_end, N)
        k = _kernel_tile(Kg, skn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU)
        k = tl.where(ok[:, None] & (rm[None, :] < M), k - k_mean[None, :], 0.0)
        if WHITEN:
            a = tl.dot(k, sp, input_precision="ieee")  # k̃ S'
            r = 1.0 / tl.sqrt(tl.maximum(tl.sum(a * k, axis=1), 0.0) + eps)
            k = k * r[:, None]
        kt = tl.trans(k)
        v = tl.load(Vg + rn[:, None] * svn + re[None, :], mask=ok[:, None] & (re[None, :] < E), other=0.0)
        if V.dtype.element_ty != tl.float32:
            # half V: the select (an identity: masked entries are 0 already) keeps the conversion to float32 ahead
            # of the tile's move into the product's layout; without it Triton moved the half tile and converted
            # it there, and the whitened pass spilled 32 bytes on sm_80 at m = e = 64 (255 registers -> 232)
            v = tl.where(ok[:, None] & (re[None, :] < E), v.to(tl.float32), 0.0)
        v = v.to(tl.float32)
        vsum += tl.sum(v, axis=0)
        acc += tl.dot(kt, v, input_precision="tf32x3")
    part = g * SPLITS + split
    tl.store(PM + part * M * E + rm[:, None] * E + re[None, :], acc, mask=(rm[:, None] < M) & (re[None, :] < E))
    tl.store(PV + part * E + re, vsum, mask=re < E)


@triton.jit
def _conv_tile(out, Vg, svn, CW, CB, has_bias, h, rn, N, E, GH, GW, BLOCK_E: tl.constexpr):
    """out + DWConv(V) of rows ``rn`` and head h's E channels: bias + the 9 taps w[c, dy, dx] · V[row + dy·GW + dx]
    over the neighbours inside the (GH, GW) grid (zero padding), V read at Vg through its row stride svn,
    the (C, 1, 3, 3) weight CW at channel h·E + c (stride 9), CB the bias (read when has_bias != 0)."""
    re = tl.arange(0, BLOCK_E)
    ch = h * E + re
    cols = re < E
    out += tl.load(CB + ch, mask=cols & (has_bias != 0), other=0.0)[None, :]
    gy = rn // GW
    gx = rn - gy * GW
    rows = rn < N
    for t in range(0, 9):  # a loop, not unrolled: one tap live at a time (the unrolled taps spilled)
        dy = t // 3 - 1
        dx = t % 3 - 1
        inside = rows & (gy + dy >= 0) & (gy + dy < GH) & (gx + dx >= 0) & (gx + dx < GW)
        v = tl.load(Vg + (rn + dy * GW + dx)[:, None] * svn + re[None, :], mask=inside[:, None] & cols[None, :],
                    other=0.0)
        out += v.to(tl.float32) * tl.load(CW + ch * 9 + t, mask=cols, other=0.0)[None, :]
    return out


@triton.jit
def output_kernel(Q, sqb, sqh, sqn, L, WI, MASK, smb, NCOUNT, CMEAN, PM, PV, OUT,
                  V, svb, svh, svn, CW, CB, has_bias, GH, GW, SM, SV, save,
                  H, N, M, D, E, scale, scale_power, rows_per_split, SPLITS,
                  WHITEN: tl.constexpr, CONV: tl.constexpr,
                  KID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, KU: tl.constexpr,
                  BLOCK_E: tl.constexpr):
    split, g = tl.program_id(0), tl.program_id(1)
    b, h = g // H, g % H
    Qg, Lg, Vg = Q + b * sqb + h * sqh, L + g * M * D, V + b * svb + h * svh
    rm = tl.arange(0, BLOCK_M)
    re = tl.arange(0, BLOCK_E)
    # prologue: M = α W⁺ Σ M' (split order), v̄, c̄
    mp = tl.zeros((BLOCK_M, BLOCK_E), dtype=tl.float32)
    vsum = tl.zeros((BLOCK_E,), dtype=tl.float32)
    for s in range(0, SPLITS):
        part = g * SPLITS + s
        mp += tl.load(PM + part * M * E + rm[:, None] * E + re[None, :], mask=(rm[:, None] < M) & (re[None, :] < E),
                      other=0.0)
        vsum += tl.load(PV + part * E + re, mask=re < E, other=0.0)
    first = (save != 0) & (split == 0)  # the training forward keeps Σ M', Σ v (ForwardState)
    tl.store(SM + g * M * E + rm[:, None] * E + re[None, :], mp, mask=(rm[:, None] < M) & (re[None, :] < E) & first)
    tl.store(SV + g * E + re, vsum, mask=(re < E) & first)
    w_inv = _square(WI + g * M * M, M, BLOCK_M, False)
    m_mat = tl.dot(w_inv, mp, input_precision="tf32x3")
    c_mean = tl.zeros((BLOCK_M,), dtype=tl.float32)
    if WHITEN:
        c_mean = tl.load(CMEAN + g * M + rm, mask=rm < M, other=0.0)
    n_valid = tl.load(NCOUNT + g)
    bias = vsum / n_valid
    # α = n^-p (the launcher passes p = 0 for the norm that does not whiten): exactly 1 for p = 0, so the
    # output keeps its bits; Σ M' (the state) stays unscaled
    m_mat = m_mat * tl.where(scale_power != 0.0, tl.exp2(-scale_power * tl.log2(n_valid)), 1.0)
    lo, row_end = split_rows_of(split, rows_per_split)
    for n0 in range(lo, row_end, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        ok = _valid_rows(MASK, smb, b, rn, row_end, N)
        # bias (v̄) and the layer's DWConv(V) first (no padding mask with a conv: ok is every row < N of the
        # split), the product accumulated onto them: after the product, its tile and the conv's taps live together
        # spilled 20–32 bytes on sm_90 (bfloat16, m = 64, e = 128)
        out = tl.zeros((BLOCK_N, BLOCK_E), dtype=tl.float32) + bias[None, :]
        if CONV:
            out = _conv_tile(out, Vg, svn, CW, CB, has_bias, h, rn, N, E, GH, GW, BLOCK_E)
        c = _kernel_tile(Qg, sqn, Lg, n0, ok, N, M, D, scale, KID, BLOCK_N, BLOCK_M, KU)
        if WHITEN:
            c = tl.where(rm[None, :] < M, c - c_mean[None, :], 0.0)
        out = tl.where(ok[:, None], tl.dot(c, m_mat, out, input_precision="tf32x3"), 0.0)
        inside = (rn[:, None] < N) & (rn[:, None] < row_end) & (re[None, :] < E)
        tl.store(OUT + b * N * H * E + rn[:, None] * (H * E) + h * E + re[None, :], out.to(OUT.dtype.element_ty),
                 mask=inside)


KU = 8
"""Features per iteration of the passes' distance loop (unrolled, as the forward kernel's)."""


def _tile_triples(c: dict) -> int:
    """(row, landmark, feature) triples one iteration of ``_kernel_tile``'s loop computes (a whole program)."""
    return c["BLOCK_N"] * c["BLOCK_M"] * c["KU"]


DISTANCE_LOOPS = {"query_stats_kernel": _tile_triples, "key_pass_kernel": _tile_triples,
                  "output_kernel": _tile_triples}
"""Every pass's C tile is ``_kernel_tile``'s (benchmarks/triton_aot.py checks the loop: no SHFL, at most
``distance_budget`` instructions per triple)."""

LOOP_ALLOWANCE = 0.5
"""Instructions per triple ``distance_budget`` allows above the loop's floor (address and loop control: 0.14
at m = 64, 0.38 at m = 16 measured on sm_80/sm_90)."""


def distance_budget(constexprs: dict, fields: dict) -> float:
    """Most SASS instructions per (row, landmark, feature) triple of ``_kernel_tile``'s loop for a specialisation
    (its constexprs, and its AOT label's fields for the dtype; benchmarks/triton_aot.py): the floor of a thread's
    R = BLOCK_N / SIDE rows × C = BLOCK_M / SIDE landmarks per feature, 2 FADDs per triple and R + C scalar loads
    per R·C triples (plus R conversions for half inputs: the landmarks are float32), and ``LOOP_ALLOWANCE``. At 8
    warps on 32-row tiles a thread holds at most 2 × 4 triples per feature (m = 64: 2.75 + 0.5), so the 2.5 of
    the forward kernel's 4 × 8 blocks is out of reach (docs/KERNELS.md, "The streaming passes")."""
    rows, cols = constexprs["BLOCK_N"] // int(SIDE), constexprs["BLOCK_M"] // int(SIDE)
    floor = 2 + (rows + cols) / (rows * cols) + (1 / cols if fields["dtype"] != "fp32" else 0)
    return floor + LOOP_ALLOWANCE


MAXNREG = 255
"""``.maxnreg`` of every launch (as the normalisation's kernels: ptxas otherwise sometimes targets fewer
registers than a kernel needs and spills)."""
_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def _p2(n: int) -> int:
    return max(16, triton.next_power_of_2(n))


def config(m: int, d: int, e: int) -> dict:
    """Tile sizes and launch options for m landmarks, head dim d, value dim e (every pass): 32-row tiles of
    BLOCK_M landmarks at 8 warps (the SIDE × SIDE threads of ``_kernel_tile``), whose distance loop walks d KU
    features per iteration: no tile depends on d."""
    return dict(BLOCK_N=BLOCK_ROWS, BLOCK_M=_p2(m), KU=KU, BLOCK_E=_p2(e), num_warps=8, num_stages=1,
                maxnreg=MAXNREG)


def query_spec(m, d, e, kid: int, whiten: bool, untied: bool) -> dict:
    cfg = config(m, d, e)
    cfg.pop("BLOCK_E")
    return dict(WHITEN=whiten, UNTIED=untied, KID=kid, **cfg)


def combine_spec(m, whiten: bool, untied: bool) -> dict:
    """The combine kernel: one program per group, 8 warps, the two m×m IEEE products from memory in chunks of 16
    (with whole operands in registers: 236 / 124 bytes spilled on sm_80 / sm_90 at 8 warps; 16 warps at 255
    registers exceed the register file, at 128 registers spilled 96 bytes on sm_90)."""
    return dict(WHITEN=whiten, UNTIED=untied, BLOCK_M=_p2(m), BLOCK_K=16, num_warps=8, num_stages=1, maxnreg=MAXNREG)


def key_spec(m, d, e, kid: int, whiten: bool) -> dict:
    return dict(WHITEN=whiten, KID=kid, **config(m, d, e))


def output_spec(m, d, e, kid: int, whiten: bool, conv: bool = False) -> dict:
    return dict(WHITEN=whiten, CONV=conv, KID=kid, **config(m, d, e))


def _launch(spec: dict) -> tuple[dict, dict]:
    opts = {k: spec[k] for k in _OPTIONS}
    return {k: v for k, v in spec.items() if k not in opts}, opts


_NO_MASK: dict = {}


def _no_mask(device: torch.device) -> torch.Tensor:
    """One 0 byte on ``device`` (kept): the mask of a call without padding, read with batch stride 0."""
    if device not in _NO_MASK:
        _NO_MASK[device] = torch.zeros(1, dtype=torch.uint8, device=device)
    return _NO_MASK[device]


def _rows_contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.stride(-1) == 1 else x.contiguous()


def streaming_triton(qs: torch.Tensor, ks: torch.Tensor, vv: torch.Tensor, marks: torch.Tensor, w_inv: torch.Tensor,
                     bandwidth: float, kernel: str, norm: str, eps: float, mask: torch.Tensor | None,
                     conv=None, save: bool = False, scale_power: float = 0.0):
    """The Nyström output of ``reference.streaming_nystrom_reference`` (same arguments) by the Triton passes:
    (B, H, N, e), a view of a (B, N, H, e) buffer of v's dtype; with ``conv`` (an ``ops.value_conv.ValueConv``)
    plus the layer's DWConv(V), so that the buffer is the layer's (B, N, C) "heads + DWConv(V)". ValueError for
    what ``limits.unfit`` or ``limits.conv_unfit`` refuses, and for ks or vv of another dtype than qs.

    qs, ks, vv are read in their dtype (float32, float16 or bfloat16, one for all three), the conv's weight and
    bias as float32 (cast when they are not); marks and w_inv are float32 (cast when not). ``scale_power`` p:
    for the whitened norms the output reads M = α W⁺ Σ M' with α = n^-p, n each group's valid rows, computed
    on the device (docs/DESIGN.md §4.6); 0 (the default) is the unscaled map, bit for bit; other norms ignore it.

    ``save`` (the training forward, ``training.py``): returns (out, state) with state the dict of the forward's
    per-group statistics the backward reads (float32, (B, H, ·)): "c_mean", "k_mean" (m), "cov", "sp" (m, m),
    "m_prime" (Σ M', m × e), "v_sum" (e); cov and sp are undefined without whitening (unread there)."""
    b, h, n, d = qs.shape
    e, m = vv.shape[-1], marks.shape[-2]
    why = unfit(norm, m, d, e, qs.dtype)
    if why is None and conv is not None:
        why = conv_unfit(conv, vv, mask, qs.dtype)
    if why is not None:
        raise ValueError(f"streaming_triton: {why}")
    for name, t in (("ks", ks), ("vv", vv)):
        if t.dtype != qs.dtype:
            raise ValueError(f"streaming_triton: {name} is {t.dtype}, qs {qs.dtype}: q, k, v are read in one dtype")
    kid = triton_kernel_id("streaming_triton", kernel)
    whiten, untied, groups = whitens(norm), ks is not qs, b * h
    q = _rows_contiguous(qs)
    k = q if not untied else _rows_contiguous(ks)
    v = _rows_contiguous(vv)
    lm = marks.reshape(groups, m, d).to(torch.float32).contiguous()
    wi = w_inv.reshape(groups, m, m).to(torch.float32).contiguous()
    splits, rows = splits_for(n, groups)
    f32 = dict(dtype=torch.float32, device=q.device)
    pad = _no_mask(q.device) if mask is None else mask.contiguous().view(torch.uint8)
    smb = 0 if mask is None else n
    scale = -1.0 / float(bandwidth)
    pcount = torch.empty(groups, splits, **f32)
    pshift = torch.empty(groups, splits, m, **f32)
    psum = torch.empty(groups, splits, m, **f32)
    pgram = torch.empty(groups, splits, m, m, **f32) if whiten else pcount
    pksum = torch.empty(groups, splits, m, **f32) if untied else pcount
    grid = (splits, groups)
    meta, opts = _launch(query_spec(m, d, e, kid, whiten, untied))
    query_stats_kernel[grid](q, q.stride(0), q.stride(1), q.stride(2), k, k.stride(0), k.stride(1), k.stride(2),
                             lm, pad, smb, pcount, pshift, psum, pgram, pksum, h, n, m, d, scale, rows, splits,
                             **meta, **opts)
    ncount, cmean, kmean = torch.empty(groups, **f32), torch.empty(groups, m, **f32), torch.empty(groups, m, **f32)
    sp, cov = psum, psum  # placeholders without whitening (unread); the training forward keeps them undefined
    if whiten or save:
        sp, cov = torch.empty(groups, m, m, **f32), torch.empty(groups, m, m, **f32)
    meta, opts = _launch(combine_spec(m, whiten, untied))
    combine_kernel[(groups,)](pcount, pshift, psum, pgram, pksum, wi, ncount, cmean, kmean, sp, cov, m, splits,
                              **meta, **opts)
    pm = torch.empty(groups, splits, m, e, **f32)
    pv = torch.empty(groups, splits, e, **f32)
    meta, opts = _launch(key_spec(m, d, e, kid, whiten))
    key_pass_kernel[grid](k, k.stride(0), k.stride(1), k.stride(2), v, v.stride(0), v.stride(1), v.stride(2), lm,
                          pad, smb, kmean, sp, pm, pv, h, n, m, d, e, scale, float(eps), rows, splits,
                          **meta, **opts)
    out = torch.empty(b, n, h, e, dtype=vv.dtype, device=q.device)
    cw, cb, has_bias, (gh, gw) = pv, pv, 0, (1, n)  # placeholders without a conv (CONV=False reads none)
    if conv is not None:  # float32 parameters: no copy; a half weight or bias: a float32 copy (C × 9, C)
        cw, cb = conv.weight.float().contiguous(), pv if conv.bias is None else conv.bias.float().contiguous()
        has_bias, (gh, gw) = int(conv.bias is not None), (1, n) if conv.hw is None else conv.hw
    sm, sv = pv, pv
    if save:
        sm, sv = torch.empty(groups, m, e, **f32), torch.empty(groups, e, **f32)
    power = float(scale_power) if whiten else 0.0  # α = 1 for the norm that does not whiten
    meta, opts = _launch(output_spec(m, d, e, kid, whiten, conv is not None))
    output_kernel[grid](q, q.stride(0), q.stride(1), q.stride(2), lm, wi, pad, smb, ncount, cmean, pm, pv, out,
                        v, v.stride(0), v.stride(1), v.stride(2), cw, cb, has_bias, gh, gw, sm, sv, int(save),
                        h, n, m, d, e, scale, power, rows, splits, **meta, **opts)
    if not save:
        return out.permute(0, 2, 1, 3)
    per_group = lambda t: t.view(b, h, *t.shape[1:])  # noqa: E731
    state = dict(c_mean=cmean, k_mean=kmean, cov=cov, sp=sp, m_prime=sm, v_sum=sv)
    return out.permute(0, 2, 1, 3), {name: per_group(t) for name, t in state.items()}


_INTS = {"smb", "save", "SPLITS", "sqb", "sqh", "sqn", "skb", "skh", "skn", "svb", "svh", "svn", "H", "N", "M", "D", "E", "rows_per_split",
         "has_bias", "GH", "GW"}


_FLOATS = {"scale", "eps", "scale_power"}
_DATA = {"Q", "K", "V", "OUT"}
"""The pointers of the input's dtype: q, k, v and the output (the other pointers are float32 workspaces,
statistics, landmarks, W⁺ and the conv's weight and bias)."""
TYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
"""Triton's name of each dtype of ``limits.LOAD_DTYPES`` (signatures and the ``dtype=`` of AOT labels)."""
assert set(TYPE_NAMES) == set(LOAD_DTYPES)


def _signature(kernel, constexprs: dict, dtype: str = "fp32") -> dict:
    """Runtime arguments -> Triton types: the mask u8, sizes and strides i32, scale, eps and scale_power fp32,
    q, k, v and the output ``*dtype``, every other pointer fp32 (workspaces, statistics, landmarks, W⁺, conv)."""
    sig = {}
    for name in kernel.arg_names:
        if name in constexprs:
            continue
        sig[name] = ("i32" if name in _INTS else "fp32" if name in _FLOATS else "*u8" if name == "MASK"
                     else f"*{dtype}" if name in _DATA else "*fp32")
    return sig


def _launches(m: int, e: int, dtype: str = "fp32"):
    """(kernel, spec, label) of every launch ``streaming_triton`` can make for these m, e and inputs of Triton
    type ``dtype`` (the specs do not depend on d: ``config`` takes nothing from d; the query pass does not depend
    on e either). The combine kernel reads only float32 workspaces: one specialisation, listed with fp32."""
    for kid in sorted(TRITON_KERNEL_IDS):
        kind = f"dtype={dtype} kid={kid}"
        for norm in STREAMED_NORMS:
            whiten = whitens(norm)
            inj = int(whiten)
            for untied in (False, True):
                yield (query_stats_kernel, query_spec(m, MAX_D, e, kid, whiten, untied),
                       f"stream_query {kind} m={m} inj={inj} untied={int(untied)}")
                if dtype == "fp32":
                    yield (combine_kernel, combine_spec(m, whiten, untied),
                           f"stream_combine dtype=fp32 m={m} inj={inj} untied={int(untied)}")
            yield key_pass_kernel, key_spec(m, MAX_D, e, kid, whiten), f"stream_key {kind} m={m} e={e} inj={inj}"
            for conv in (False, True):
                yield (output_kernel, output_spec(m, MAX_D, e, kid, whiten, conv),
                       f"stream_out {kind} m={m} e={e} inj={inj} conv={int(conv)}")


def aot_specialisations(d_max: int = 128, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label, options) ``streaming_triton`` can
    produce for m <= min(m_max, 64), e <= min(d_max, 128), any d <= 128 and each input dtype of
    ``limits.LOAD_DTYPES`` (float32 first, labels ``dtype=fp32|fp16|bf16``), from the same ``*_spec`` functions
    (benchmarks/triton_aot.py). m and e are enumerated as powers of two (the specs depend on them only through
    ``next_power_of_2``, and not on d); identical specialisations (per dtype) are yielded once, under the label
    of their first launch. The mask and scale_power are runtime arguments (no specialisation of their own)."""
    sizes = [(m, e) for m in power_of_two_sizes(m_max, MAX_M) for e in power_of_two_sizes(d_max, MAX_D)]
    for name in TYPE_NAMES.values():
        yield from distinct_launches((launch for m, e in sizes for launch in _launches(m, e, name)),
                                     lambda kernel, meta, name=name: _signature(kernel, meta, name))