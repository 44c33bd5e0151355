"""Fused Triton kernels for the kernel primitives (docs/DESIGN.md §1, §6); formulas in ``cpu.py``.

- ``laplace_kernel_fwd_kernel``: C = k(D) tile by tile, D the accumulated distance (L1, or squared L2: the
  family's ``sums_abs``) and k the family's profile (``_triton_common.kernel_value``: exp(−D / lam) for the
  Laplacian and the Gaussian), fused in one pass (no raw-distance round trip).
- ``laplace_matmul_fwd_kernel``: C @ V with C recomputed per (BLOCK_N, BLOCK_M) tile and never stored.
- ``laplace_dx_kernel`` / ``laplace_dy_kernel``: the backward, either from a given dL/dC and C
  (``laplace_kernel``) or recomputing C and dL/dC = dO Vᵀ tile by tile (``laplace_kernel_matmul``).
  dY and dV are reduced over N in fixed splits into float32 workspaces and summed by a second pass
  (deterministic, no atomics). sign(0) = 0; dL/dD = dL/dC · ``kernel_slope`` (−C / lam for the exp families;
  the families whose slope reads the distance recompute it where C is given).

Every kernel takes the kernel family's id as the constexpr ``KID`` (``KernelSpec.id``; docs/KERNELS.md,
"Kernel families"): the distance loops accumulate what ``sums_abs(KID)`` says and the profile is applied after
them.

Register budget (docs/KERNELS.md): no tile grows with d or e. The forward sums the distance over d in a
loop over single features into a register-blocked (R, C, TN, TM) accumulator (``_distance``: 64 x 64
tiles, each thread 4 rows x 8 landmarks, no shuffles, about 2.4 SASS instructions per (row, landmark,
feature), ``DISTANCE_LOOPS``) from float32 copies of X and Y; e is taken in slices of at most 64 (a grid
axis). The backward keeps the chunked form: 16 x 16 x 32 difference tiles reduced with ``tl.sum``
(``_distance_chunks``), dX / dY / dV as up to four chunk accumulators; without V each backward program takes
one chunk of d (a grid axis), with V dL/dC = dO Vᵀ is summed over e in chunks. ``benchmarks/triton_aot.py
--strict`` compiles every specialisation (``aot_specialisations``, built from the launchers' ``*_config``
functions) for sm_80 and sm_90 and checks that none spills and that the forward's distance loop meets its
instruction budget; d, e <= 128 (the registry refuses larger ones).

Inputs float32/float16/bfloat16, accumulation in float32, outputs in the input dtype. Products with V in
the forward run as ``tl.dot`` on the float32 C tile: 3-pass TF32 for float32 inputs (about float32
accuracy; the IEEE FMA product spills with 64-row tiles), TF32 for half inputs; in the backward always IEEE
float32 (the TF32 path needs more registers there, and costs little: the distance dominates). The host
functions are registered with ``torch.library.triton_op`` (``laplacianformer::...``) so torch.compile
traces them, with autograd through ``_autograd.py`` (the glue shared with ``cpu.py``). Dispatch: ``kernel/__init__.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from torch.library import triton_op, wrap_triton

from .._triton_common import (dot, family_slope_reads_distance, family_sums_abs, kernel_chain, kernel_value, load_block,
                              slope_reads_distance, store_block, sums_abs)
from ..layout import flatten_batch
from .limits import TRITON_KERNEL_IDS, TRITON_MAX_D, TRITON_MAX_E
from .limits import triton_unfit as unfit
from ._autograd import register_kernel_autograd, register_matmul_autograd

_SPLITS = 16
CHUNK = 32
"""Width of the feature chunks (of d, and of e in the backward): the largest slice of a row a kernel
holds at once, so that no tile grows with d or e (docs/KERNELS.md, "Register budget")."""
MAX_D = TRITON_MAX_D
MAX_E = TRITON_MAX_E


@triton.jit
def _distance_tile(x, y, KID: tl.constexpr):
    diff = x[:, None, :] - y[None, :, :]
    if sums_abs(KID):
        return tl.sum(tl.abs(diff), axis=2)
    return tl.sum(diff * diff, axis=2)


@triton.jit
def _distance_chunks(Xb, Yb, rn, rm, N, M, D, KID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                     BLOCK_D: tl.constexpr, NUM_D: tl.constexpr):
    """(BLOCK_N, BLOCK_M) distances, summed over d in NUM_D chunks of BLOCK_D (unrolled), as 3-D difference
    tiles reduced with ``tl.sum`` (warp shuffles): the backward's recomputed C on its 16 x 16 tiles."""
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for k in tl.static_range(NUM_D):
        acc += _distance_tile(load_block(Xb, rn, N, D, k * BLOCK_D, BLOCK_D),
                              load_block(Yb, rm, M, D, k * BLOCK_D, BLOCK_D), KID)
    return acc


@triton.jit
def _distance_loop(Xb, Yb, rn, rm, N, M, D, KID: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """``_distance_chunks`` over all of d in a loop of BLOCK_D chunks (not unrolled): the distance the backward
    without V recomputes for a family whose slope reads it (``slope_reads_distance``)."""
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        acc += _distance_tile(load_block(Xb, rn, N, D, d0, BLOCK_D), load_block(Yb, rm, M, D, d0, BLOCK_D), KID)
    return acc


@triton.jit
def _blocked_rows(r0, R: tl.constexpr, T: tl.constexpr, AXIS: tl.constexpr):
    """Indices r0 + r·T + t of a register-blocked tile (``_distance``), shaped (R, 1, T, 1) for AXIS=0 (rows)
    or (1, R, 1, T) for AXIS=1 (landmarks)."""
    if AXIS == 0:
        idx = r0 + tl.arange(0, R)[:, None, None, None] * T + tl.arange(0, T)[None, None, :, None]
    else:
        idx = r0 + tl.arange(0, R)[None, :, None, None] * T + tl.arange(0, T)[None, None, None, :]
    return idx


@triton.jit
def _accumulate_distance(acc, x, y, KID: tl.constexpr):
    diff = x - y
    if sums_abs(KID):
        return acc + tl.abs(diff)
    return acc + diff * diff


@triton.jit
def _distance(Xb, Yb, n0, m0, N, M, D, KID: tl.constexpr, R: tl.constexpr, C: tl.constexpr, TN: tl.constexpr,
              TM: tl.constexpr, KU: tl.constexpr):
    """``_distance_strided`` of row-major X (N, D) and Y (M, D)."""
    return _distance_strided(Xb, D, Yb, D, n0, m0, N, M, D, KID, R, C, TN, TM, KU)


@triton.jit
def _distance_strided(Xb, sx, Yb, sy, n0, m0, N, M, D, KID: tl.constexpr, R: tl.constexpr, C: tl.constexpr,
                      TN: tl.constexpr, TM: tl.constexpr, KU: tl.constexpr):
    """Register-blocked distances: (R, C, TN, TM), element [r, c, i, j] = dist(x_{n0 + r·TN + i},
    y_{m0 + c·TM + j}) (0-based; rows >= N and landmarks >= M repeat the last one). X (N, D) with row stride
    sx, Y (M, D) with row stride sy, features contiguous, any float dtype (converted to float32 after each
    load: a no-op for float32).

    A loop over the feature index k adds |x_nk - y_mk| (or its square: ``sums_abs(KID)``) into the 4-D
    accumulator: each thread holds R rows x C landmarks of it (the default layout puts the threads on the TN and TM axes) and
    loads their R + C features k as scalars, so a column costs R + C loads and 2·R·C FADDs per thread and
    no shuffles. The loads stay in the accumulator's layout (no shared-memory round trip) because each has
    fewer elements than the program has threads (R < TM, C < TN). KU columns per iteration, unrolled and
    unmasked; the D % KU last ones one at a time (docs/KERNELS.md, "Register budget")."""
    xp = Xb + tl.minimum(_blocked_rows(n0, R, TN, 0), N - 1) * sx
    yp = Yb + tl.minimum(_blocked_rows(m0, C, TM, 1), M - 1) * sy
    acc = tl.zeros((R, C, TN, TM), dtype=tl.float32)
    d_main = D - D % KU
    for k0 in range(0, d_main, KU):
        for j in tl.static_range(KU):
            acc = _accumulate_distance(acc, tl.load(xp + (k0 + j)).to(tl.float32),
                                       tl.load(yp + (k0 + j)).to(tl.float32), KID)
    for k in range(d_main, D):
        acc = _accumulate_distance(acc, tl.load(xp + k).to(tl.float32), tl.load(yp + k).to(tl.float32), KID)
    return acc


@triton.jit
def _unblock(t, R: tl.constexpr, C: tl.constexpr, TN: tl.constexpr, TM: tl.constexpr):
    """A ``_distance``-shaped (R, C, TN, TM) tile as the (R·TN, C·TM) matrix of rows n0 + r·TN + i and
    landmarks m0 + c·TM + j."""
    return tl.reshape(tl.permute(t, (0, 2, 1, 3)), (R * TN, C * TM))


@triton.jit
def _sign_weighted(Xb, Yb, rn, rm, N, M, D, d0, gp, KID: tl.constexpr, AXIS: tl.constexpr,
                   BLOCK_D: tl.constexpr):
    """sum over AXIS of dL/dD · d dist / dx on the feature chunk d0 .. d0 + BLOCK_D: (BLOCK_N, BLOCK_D) for
    AXIS=1, (BLOCK_M, BLOCK_D) for AXIS=0."""
    x = load_block(Xb, rn, N, D, d0, BLOCK_D)
    y = load_block(Yb, rm, M, D, d0, BLOCK_D)
    if sums_abs(KID):
        diff = x[:, None, :] - y[None, :, :]
        s = tl.where(diff > 0, 1.0, tl.where(diff < 0, -1.0, 0.0))
        return tl.sum(s * gp[:, :, None], axis=AXIS)
    # squared L2: sum_m gp_nm · 2 (x_n - y_m) is linear in x and y, two IEEE products, no 3-D tile
    if AXIS == 1:
        return 2.0 * (x * tl.sum(gp, axis=1)[:, None] - tl.dot(gp, y, input_precision="ieee"))
    return 2.0 * (tl.dot(tl.trans(gp), x, input_precision="ieee") - y * tl.sum(gp, axis=0)[:, None])


# The backward keeps dX, dY and dV as up to four chunk accumulators a0..a3 (chunk k: feature columns
# c0 + k·BLOCK .. c0 + (k + 1)·BLOCK), of which the first NUM (1, 2 or 4) are used; the helpers below create,
# update and store them so that no tile grows with d or e (docs/KERNELS.md, "Register budget").


@triton.jit
def _zero_chunks(ROWS: tl.constexpr, BLOCK: tl.constexpr):
    z = tl.zeros((ROWS, BLOCK), dtype=tl.float32)
    return z, z, z, z


@triton.jit
def _accumulate(acc, x, SUBTRACT: tl.constexpr):
    if SUBTRACT:
        return acc - x
    return acc + x


@triton.jit
def _add_distance_grads(a0, a1, a2, a3, Xb, Yb, rn, rm, N, M, D, d0, gp, KID: tl.constexpr, AXIS: tl.constexpr,
                        BLOCK_D: tl.constexpr, NUM_D: tl.constexpr):
    """The dX (AXIS=1) or dY (AXIS=0) chunks from d0 on plus one tile's terms ``_sign_weighted``; dY takes
    them with a minus (d dist / dy = -d dist / dx)."""
    a0 = _accumulate(a0, _sign_weighted(Xb, Yb, rn, rm, N, M, D, d0, gp, KID, AXIS, BLOCK_D), AXIS == 0)
    if NUM_D > 1:
        a1 = _accumulate(a1, _sign_weighted(Xb, Yb, rn, rm, N, M, D, d0 + BLOCK_D, gp, KID, AXIS, BLOCK_D), AXIS == 0)
    if NUM_D > 2:
        a2 = _accumulate(a2, _sign_weighted(Xb, Yb, rn, rm, N, M, D, d0 + 2 * BLOCK_D, gp, KID, AXIS, BLOCK_D),
                         AXIS == 0)
        a3 = _accumulate(a3, _sign_weighted(Xb, Yb, rn, rm, N, M, D, d0 + 3 * BLOCK_D, gp, KID, AXIS, BLOCK_D),
                         AXIS == 0)
    return a0, a1, a2, a3


@triton.jit
def _add_products(a0, a1, a2, a3, lhs, B, rows, R, C, IEEE: tl.constexpr, BLOCK: tl.constexpr,
                  NUM: tl.constexpr):
    """The chunks from column 0 on plus lhs @ B[rows, chunk], B row-major (R, C)."""
    a0 += dot(lhs, load_block(B, rows, R, C, 0, BLOCK), IEEE)
    if NUM > 1:
        a1 += dot(lhs, load_block(B, rows, R, C, BLOCK, BLOCK), IEEE)
    if NUM > 2:
        a2 += dot(lhs, load_block(B, rows, R, C, 2 * BLOCK, BLOCK), IEEE)
        a3 += dot(lhs, load_block(B, rows, R, C, 3 * BLOCK, BLOCK), IEEE)
    return a0, a1, a2, a3


@triton.jit
def _store_chunks(P, a0, a1, a2, a3, rows, R, C, c0, BLOCK: tl.constexpr, NUM: tl.constexpr):
    """Writes the chunks from c0 on into the row-major (R, C) matrix at P."""
    store_block(P, a0, rows, R, C, c0, BLOCK)
    if NUM > 1:
        store_block(P, a1, rows, R, C, c0 + BLOCK, BLOCK)
    if NUM > 2:
        store_block(P, a2, rows, R, C, c0 + 2 * BLOCK, BLOCK)
        store_block(P, a3, rows, R, C, c0 + 3 * BLOCK, BLOCK)


@triton.jit
def laplace_kernel_fwd_kernel(
    X, Y, OUT, N, M, D, scale,
    KID: tl.constexpr, R: tl.constexpr, C: tl.constexpr, TN: tl.constexpr, TM: tl.constexpr, KU: tl.constexpr,
):
    """One (R·TN, C·TM) tile of C, stored in ``_distance``'s blocked layout (no conversion). X, Y float32."""
    pid_n, pid_m, b = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    n0, m0 = pid_n * R * TN, pid_m * C * TM
    c = kernel_value(_distance(X + b * N * D, Y + b * M * D, n0, m0, N, M, D, KID, R, C, TN, TM, KU), scale, KID)
    rows, cols = _blocked_rows(n0, R, TN, 0), _blocked_rows(m0, C, TM, 1)
    tl.store(OUT + b * N * M + rows * M + cols, c.to(OUT.dtype.element_ty), mask=(rows < N) & (cols < M))


@triton.jit
def _product(acc, c, Vb, m0, M, E, e0, IEEE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_E: tl.constexpr):
    """acc + c @ V[m0 : m0 + BLOCK_M, e0 : e0 + BLOCK_E] (outside V read as 0): float32 inputs as 3-pass
    TF32 (about float32 accuracy; the IEEE FMA product spills at this tile size), else TF32."""
    v = load_block(Vb, m0 + tl.arange(0, BLOCK_M), M, E, e0, BLOCK_E)
    if IEEE:
        return acc + tl.dot(c, v, input_precision="tf32x3")
    return acc + tl.dot(c, v)


@triton.jit
def laplace_matmul_fwd_kernel(
    X, Y, V, OUT, N, M, D, E, scale,
    KID: tl.constexpr, IEEE: tl.constexpr, R: tl.constexpr, C: tl.constexpr, TN: tl.constexpr, TM: tl.constexpr,
    KU: tl.constexpr, BLOCK_E: tl.constexpr,
):
    """Columns e0 .. e0 + BLOCK_E (e0 = program_id(2) · BLOCK_E) of one block of R·TN rows of C @ V, looping
    over the landmarks in blocks of C·TM. X, Y float32. Each C tile is multiplied as two halves of its C
    axis (C·TM / 2 landmarks each: smaller operands, no spills on sm_80)."""
    pid_n, b, e0 = tl.program_id(0), tl.program_id(1), tl.program_id(2) * BLOCK_E
    n0 = pid_n * R * TN
    Vb = V + b * M * E
    acc = tl.zeros((R * TN, BLOCK_E), dtype=tl.float32)
    for m0 in range(0, M, C * TM):
        # landmarks >= M: C finite (the last landmark repeated), V rows 0
        c = kernel_value(_distance(X + b * N * D, Y + b * M * D, n0, m0, N, M, D, KID, R, C, TN, TM, KU), scale,
                         KID)
        lo, hi = tl.split(tl.permute(tl.reshape(c, (R, 2, C // 2, TN, TM)), (0, 2, 3, 4, 1)))
        acc = _product(acc, _unblock(lo, R, C // 2, TN, TM), Vb, m0, M, E, e0, IEEE, C // 2 * TM, BLOCK_E)
        acc = _product(acc, _unblock(hi, R, C // 2, TN, TM), Vb, m0 + C // 2 * TM, M, E, e0, IEEE, C // 2 * TM,
                       BLOCK_E)
    store_block(OUT + b * N * E, acc, n0 + tl.arange(0, R * TN), N, E, e0, BLOCK_E)


@triton.jit
def _grad_tile(Xb, Yb, G, C, Vb, GOb, rn, rm, b, N, M, D, E, scale,
               KID: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D: tl.constexpr, BLOCK_E: tl.constexpr,
               NUM_E: tl.constexpr):
    """dL/dD on one (BLOCK_N, BLOCK_M) tile, and the recomputed (HAS_V) or loaded C tile. With V,
    dL/dC = dO Vᵀ is summed over e in NUM_E chunks of BLOCK_E; without, a family whose slope reads the
    distance recomputes it over all of d (``_distance_loop``)."""
    mask = (rn[:, None] < N) & (rm[None, :] < M)
    if HAS_V:
        acc = _distance_chunks(Xb, Yb, rn, rm, N, M, D, KID, BLOCK_N, BLOCK_M, BLOCK_D, NUM_D)
        c = tl.where(mask, kernel_value(acc, scale, KID), 0.0)
        g = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
        for k in tl.static_range(NUM_E):
            go = load_block(GOb, rn, N, E, k * BLOCK_E, BLOCK_E)
            v = load_block(Vb, rm, M, E, k * BLOCK_E, BLOCK_E)
            g += dot(go, tl.trans(v), IEEE)
    else:
        offs = b * N * M + rn[:, None] * M + rm[None, :]
        c = tl.load(C + offs, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(G + offs, mask=mask, other=0.0).to(tl.float32)
        acc = c  # unread unless the slope reads the distance
        if slope_reads_distance(KID):
            acc = _distance_loop(Xb, Yb, rn, rm, N, M, D, KID, BLOCK_N, BLOCK_M, BLOCK_D)
    return kernel_chain(g, c, acc, scale, KID, False), c


@triton.jit
def laplace_dx_kernel(
    X, Y, G, C, V, GO, DX, N, M, D, E, scale,
    KID: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D: tl.constexpr,
    BLOCK_E: tl.constexpr, NUM_E: tl.constexpr,
):
    """dX for one BLOCK_N row block, looping over M. With V the program takes all of d as NUM_D (<= 4)
    chunks of BLOCK_D (dL/dC needs the whole distance); without, one chunk (NUM_D = 1) at d0 =
    program_id(2) · BLOCK_D, so no tile grows with d."""
    pid_n, b = tl.program_id(0), tl.program_id(1)
    if HAS_V:
        d0 = 0
    else:
        d0 = tl.program_id(2) * BLOCK_D
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    Xb, Yb = X + b * N * D, Y + b * M * D
    Vb, GOb = V + b * M * E, GO + b * N * E
    dx0, dx1, dx2, dx3 = _zero_chunks(BLOCK_N, BLOCK_D)
    for m0 in range(0, M, BLOCK_M):
        rm = m0 + tl.arange(0, BLOCK_M)
        gp, _ = _grad_tile(Xb, Yb, G, C, Vb, GOb, rn, rm, b, N, M, D, E, scale, KID, HAS_V, IEEE,
                           BLOCK_N, BLOCK_M, BLOCK_D, NUM_D, BLOCK_E, NUM_E)
        dx0, dx1, dx2, dx3 = _add_distance_grads(dx0, dx1, dx2, dx3, Xb, Yb, rn, rm, N, M, D, d0, gp, KID, 1,
                                                 BLOCK_D, NUM_D)
    _store_chunks(DX + b * N * D, dx0, dx1, dx2, dx3, rn, N, D, d0, BLOCK_D, NUM_D)


@triton.jit
def laplace_dy_kernel(
    X, Y, G, C, V, GO, DY_PART, DV_PART, N, M, D, E, scale, ROWS_PER_SPLIT,
    KID: tl.constexpr, HAS_V: tl.constexpr, IEEE: tl.constexpr,
    BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_D: tl.constexpr, NUM_D: tl.constexpr,
    BLOCK_E: tl.constexpr, NUM_E: tl.constexpr,
):
    """dY (and dV) of one BLOCK_M row block over one split of N, into float32 workspaces; dY is held as
    NUM_D chunks of BLOCK_D (without V one chunk, grid axis 2 = batch · chunks + chunk, as in
    ``laplace_dx_kernel``), dV as NUM_E chunks of BLOCK_E."""
    pid_m, split = tl.program_id(0), tl.program_id(1)
    if HAS_V:
        b = tl.program_id(2)
        d0 = 0
    else:
        groups = tl.cdiv(D, BLOCK_D)
        b = tl.program_id(2) // groups
        d0 = (tl.program_id(2) % groups) * BLOCK_D
    nsplit = tl.num_programs(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    Xb, Yb = X + b * N * D, Y + b * M * D
    Vb, GOb = V + b * M * E, GO + b * N * E
    dy0, dy1, dy2, dy3 = _zero_chunks(BLOCK_M, BLOCK_D)
    dv0, dv1, dv2, dv3 = _zero_chunks(BLOCK_M, BLOCK_E)
    n_lo = split * ROWS_PER_SPLIT
    for n0 in range(n_lo, n_lo + ROWS_PER_SPLIT, BLOCK_N):
        rn = n0 + tl.arange(0, BLOCK_N)
        gp, c = _grad_tile(Xb, Yb, G, C, Vb, GOb, rn, rm, b, N, M, D, E, scale, KID, HAS_V, IEEE,
                           BLOCK_N, BLOCK_M, BLOCK_D, NUM_D, BLOCK_E, NUM_E)
        dy0, dy1, dy2, dy3 = _add_distance_grads(dy0, dy1, dy2, dy3, Xb, Yb, rn, rm, N, M, D, d0, gp, KID, 0,
                                                 BLOCK_D, NUM_D)
        if HAS_V:
            dv0, dv1, dv2, dv3 = _add_products(dv0, dv1, dv2, dv3, tl.trans(c), GOb, rn, N, E, IEEE,
                                               BLOCK_E, NUM_E)
    part = b * nsplit + split
    _store_chunks(DY_PART + part * M * D, dy0, dy1, dy2, dy3, rm, M, D, d0, BLOCK_D, NUM_D)
    if HAS_V:
        _store_chunks(DV_PART + part * M * E, dv0, dv1, dv2, dv3, rm, M, E, 0, BLOCK_E, NUM_E)


def _pow2(n: int, lo: int = 16) -> int:
    return max(lo, triton.next_power_of_2(n))


def _chunks(n: int) -> tuple[int, int]:
    """(BLOCK, NUM): a feature dim n <= 128 as NUM (1, 2 or 4) chunks of BLOCK (16 or 32) columns."""
    full = _pow2(n)
    block = min(full, CHUNK)
    return block, full // block


DISTANCE_BLOCK = dict(R=4, C=8, TN=16, TM=8, KU=8, num_warps=4)
"""The forward's register blocking (``_distance``): 64 x 64 tiles on 4 warps, each thread 4 rows x 8
landmarks (R < TM and C < TN keep the loads in the accumulator's layout), 8 features per loop iteration:
(4 + 8) loads and 2 · 32 FADDs per feature, about 2.4 SASS instructions per (row, landmark, feature)
(benchmarks/triton_aot.py; docs/KERNELS.md, "Register budget"). Independent of d."""


def _block_rows(cfg: dict) -> tuple[int, int]:
    """(rows, landmarks) of one ``_distance`` tile: (R·TN, C·TM)."""
    return cfg["R"] * cfg["TN"], cfg["C"] * cfg["TM"]


def fwd_config(d: int) -> dict:
    """Launch configuration of ``laplace_kernel_fwd_kernel`` (any d: the loop over d is not unrolled)."""
    return dict(DISTANCE_BLOCK, num_stages=1)


MATMUL_MAX_BLOCK_E = 64
"""Widest slice of e one ``laplace_matmul_fwd_kernel`` program computes: e = 128 takes two programs per row
block (the distance computed twice; one 64 x 128 float32 accumulator spills on sm_80)."""


def matmul_fwd_config(d: int, e: int) -> dict:
    """Launch configuration of ``laplace_matmul_fwd_kernel``: e in slices of BLOCK_E (a grid axis)."""
    return dict(DISTANCE_BLOCK, BLOCK_E=min(_pow2(e), MATMUL_MAX_BLOCK_E), num_stages=1)


_BWD_WARPS = {
    ("dx", True, 64, 128): 16, ("dy", True, 64, 64): 16,
    ("dy", False, 64, 16): 16, ("dy", False, 32, 128): 16, ("dy", False, 128, 128): 16,
    ("dy", False, 32, 32): 16, ("dx", False, 16, 16): 8, ("dy", False, 128, 64): 4,
}
"""Exceptions to 8 warps for the backward with V, keyed (kernel, L1 accumulation, d, e) with d, e powers of two:
where ptxas, at 8 warps, caps registers at 128 and spills a few bytes (sm_80 and sm_90 swept by
benchmarks/triton_aot.py, every family). ("dy", L2, 64, 64) is not one: at 16 warps Matérn-3/2 spilled 8 bytes on
sm_90 (64 registers), at 8 warps no L2 family spills (106-128 registers). The last three entries, from the strict
run of every family (7 December 2026): at the default warps Matérn-3/2 spilled 4 and 8 bytes on sm_90 (dy 32/32,
dx 16/16) and Cauchy 12 (dy 128/64); with these, no L2 family spills on sm_80 or sm_90. The default is 4 warps
where d's chunk is 16 wide or less, else 8."""


def bwd_config(d: int, e: int | None, kernel: str = "dx", kid: int = 0) -> dict:
    """Launch configuration of ``laplace_dx_kernel`` (kernel "dx") / ``laplace_dy_kernel`` ("dy") for the family
    id ``kid``; e None: no V. Without V each program takes one 32-wide chunk of d (GROUPS programs along d); with V
    all of d (the recomputed C needs the whole distance) and e in chunks of 32. 16 x 16 x BLOCK_D difference
    tiles."""
    bd, nd = _chunks(d)
    if e is None:
        # the dY kernel of a family whose slope reads the distance (it recomputes it over all of d): at 8 warps
        # ptxas held it to 64 registers and spilled 8 bytes on sm_80; 16 warps, 64 registers, none
        warps = 4 if bd <= 16 else 16 if kernel == "dy" and family_slope_reads_distance(kid) else 8
        return dict(BLOCK_N=16, BLOCK_M=16, BLOCK_D=bd, NUM_D=1, BLOCK_E=16, NUM_E=1, GROUPS=triton.cdiv(d, bd),
                    num_warps=warps, num_stages=1)
    be, ne = _chunks(e)
    warps = _BWD_WARPS.get((kernel, family_sums_abs(kid), _pow2(d), _pow2(e)), 4 if bd <= 16 else 8)
    return dict(BLOCK_N=16, BLOCK_M=16, BLOCK_D=bd, NUM_D=nd, BLOCK_E=be, NUM_E=ne, GROUPS=1,
                num_warps=warps, num_stages=1)


def _splits(n: int, block_n: int) -> tuple[int, int]:
    blocks = triton.cdiv(n, block_n)
    splits = max(1, min(_SPLITS, blocks))
    rows = triton.cdiv(blocks, splits) * block_n
    return triton.cdiv(n, rows), rows


_TL = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
_INTS = {"N", "M", "D", "E", "ROWS_PER_SPLIT"}


def _signature(kernel, ptr: str, f32_ptrs: tuple[str, ...] = ()) -> dict[str, str]:
    """Triton types of ``kernel``'s runtime arguments: pointers ``*ptr`` (``*fp32`` for ``f32_ptrs``)."""
    sig = {}
    for p in kernel.params:
        if not p.is_constexpr:
            name = p.name
            sig[name] = "i32" if name in _INTS else "fp32" if name == "scale" else f"*{'fp32' if name in f32_ptrs else ptr}"
    return sig


DISTANCE_LOOPS = {
    "laplace_kernel_fwd_kernel": lambda c: c["R"] * c["C"] * c["TN"] * c["TM"] * c["KU"],
    "laplace_matmul_fwd_kernel": lambda c: c["R"] * c["C"] * c["TN"] * c["TM"] * c["KU"],
}
"""The distance kernels (benchmarks/triton_aot.py): kernel name -> (row, landmark, feature) triples one
iteration of its inner loop computes, from the specialisation's constexprs."""


_F32_XY = ("X", "Y")
"""The forward kernels read X and Y in float32 (the launchers upcast half inputs: an O((N + M)·d) copy
against O(N·M·d) work, and no conversion in the distance loop)."""


def _split(cfg: dict) -> tuple[dict, int, int]:
    cfg = dict(cfg)
    cfg.pop("GROUPS", None)
    return cfg, cfg.pop("num_warps"), cfg.pop("num_stages")


def aot_specialisations(d_max: int = MAX_D, m_max: int = 128):
    """Every (kernel, signature, constexprs, num_warps, num_stages, label) the launchers below can produce
    for d, e <= d_max, from the same ``*_config`` functions (benchmarks/triton_aot.py; docs/KERNELS.md).
    Feature dims are enumerated as powers of two (the configs depend on d and e only through
    ``next_power_of_2``); identical specialisations are yielded once, labelled with their largest d/e."""
    dims = [b for b in (128, 64, 32, 16) if b <= _pow2(min(d_max, MAX_D))]
    seen = set()

    def once(kernel, sig, cfg, label):
        meta, warps, stages = _split(cfg)
        key = (kernel.__name__, tuple(sorted(sig.items())), tuple(sorted(meta.items())), warps, stages)
        if key not in seen:
            seen.add(key)
            yield kernel, sig, meta, warps, stages, label

    for dtype, tname in _TL.items():
        ieee = dtype == torch.float32
        for kid in sorted(TRITON_KERNEL_IDS):
            kind = f"kid={kid}"
            for d in dims:
                yield from once(laplace_kernel_fwd_kernel, _signature(laplace_kernel_fwd_kernel, tname, _F32_XY),
                                dict(fwd_config(d), KID=kid), f"kernel_fwd dtype={tname} {kind} d={d}")
                for k, fam in ((laplace_dx_kernel, "kernel_bwd_dx"), (laplace_dy_kernel, "kernel_bwd_dy")):
                    if dtype != torch.float32:  # the backward upcasts half inputs (_backward)
                        continue
                    yield from once(k, _signature(k, tname, ("DY_PART", "DV_PART")),
                                    dict(bwd_config(d, None, fam[-2:], kid), KID=kid, HAS_V=False, IEEE=True),
                                    f"{fam} dtype={tname} {kind} d={d}")
                for e in dims:
                    yield from once(laplace_matmul_fwd_kernel, _signature(laplace_matmul_fwd_kernel, tname, _F32_XY),
                                    dict(matmul_fwd_config(d, e), KID=kid, IEEE=ieee),
                                    f"matmul_fwd dtype={tname} {kind} d={d} e={e}")
                    if dtype != torch.float32 or unfit(family_sums_abs(kid), d, e, dtype):  # upcast / refused
                        continue
                    for k, fam in ((laplace_dx_kernel, "matmul_bwd_dx"), (laplace_dy_kernel, "matmul_bwd_dy")):
                        yield from once(k, _signature(k, tname, ("DY_PART", "DV_PART")),
                                        dict(bwd_config(d, e, fam[-2:], kid), KID=kid, HAS_V=True, IEEE=True),
                                        f"{fam} dtype={tname} {kind} d={d} e={e}")


@triton_op("laplacianformer::laplace_kernel_fwd", mutates_args=())
def laplace_kernel_fwd(x: torch.Tensor, y: torch.Tensor, scale: float, kid: int) -> torch.Tensor:
    """k(D) of family id ``kid``, scale = −1 / λ.  x: (B, N, d), y: (B, M, d) contiguous -> (B, N, M)."""
    b, n, d = x.shape
    m = y.shape[1]
    out = torch.empty(b, n, m, dtype=x.dtype, device=x.device)
    cfg = fwd_config(d)
    bn, bm = _block_rows(cfg)
    grid = (triton.cdiv(n, bn), triton.cdiv(m, bm), b)
    wrap_triton(laplace_kernel_fwd_kernel)[grid](x.float(), y.float(), out, n, m, d, scale, KID=kid, **cfg)
    return out


@triton_op("laplacianformer::laplace_matmul_fwd", mutates_args=())
def laplace_matmul_fwd(x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, scale: float, kid: int) -> torch.Tensor:
    """k(D) @ V.  x: (B, N, d), y: (B, M, d), v: (B, M, e) contiguous -> (B, N, e)."""
    b, n, d = x.shape
    m, e = v.shape[1], v.shape[2]
    out = torch.empty(b, n, e, dtype=x.dtype, device=x.device)
    cfg = matmul_fwd_config(d, e)
    grid = (triton.cdiv(n, _block_rows(cfg)[0]), b, triton.cdiv(e, cfg["BLOCK_E"]))
    wrap_triton(laplace_matmul_fwd_kernel)[grid](x.float(), y.float(), v, out, n, m, d, e, scale, KID=kid,
                                                 IEEE=v.dtype == torch.float32, **cfg)
    return out


def _launch_meta(cfg: dict) -> tuple[dict, int]:
    meta = dict(cfg)
    return meta, meta.pop("GROUPS")


def _backward(x, y, g, c, v, go, scale, kid):
    if x.dtype != torch.float32:
        # half inputs: the float32 kernels on upcast copies (O(N·d) extra traffic against O(N·M·d) work);
        # the half variants hit ptxas register caps on sm_90 (docs/KERNELS.md, "Register budget")
        f = [t.float() if t is not None else None for t in (x, y, g, c, v, go)]
        dx, dy, dv = _backward(*f, scale, kid)
        return dx.to(x.dtype), dy.to(y.dtype), dv.to(v.dtype) if dv is not None else None
    b, n, d = x.shape
    m = y.shape[1]
    has_v = v is not None
    e = v.shape[2] if has_v else 1
    dx = torch.empty_like(x)
    dummy = x
    args = (g if g is not None else dummy, c if c is not None else dummy, v if has_v else dummy,
            go if go is not None else dummy)
    # the products with V run as float32 FMA for every input dtype (IEEE: it fits, see bwd_config)
    meta, groups = _launch_meta(bwd_config(d, e if has_v else None, "dx", kid))
    bn = meta["BLOCK_N"]
    wrap_triton(laplace_dx_kernel)[(triton.cdiv(n, bn), b, groups)](
        x, y, *args, dx, n, m, d, e, scale, KID=kid, HAS_V=has_v, IEEE=True, **meta)
    meta, groups = _launch_meta(bwd_config(d, e if has_v else None, "dy", kid))
    splits, rows = _splits(n, meta["BLOCK_N"])
    dy_part = torch.empty(b, splits, m, d, dtype=torch.float32, device=x.device)
    dv_part = torch.empty(b, splits, m, e, dtype=torch.float32, device=x.device) if has_v else dy_part
    wrap_triton(laplace_dy_kernel)[(triton.cdiv(m, meta["BLOCK_M"]), splits, b * groups)](
        x, y, *args, dy_part, dv_part, n, m, d, e, scale, rows, KID=kid, HAS_V=has_v, IEEE=True, **meta)
    dy = dy_part.sum(1).to(y.dtype)
    dv = dv_part.sum(1).to(v.dtype) if has_v else None
    return dx, dy, dv


@triton_op("laplacianformer::laplace_kernel_bwd", mutates_args=())
def laplace_kernel_bwd(
    x: torch.Tensor, y: torch.Tensor, grad: torch.Tensor, out: torch.Tensor, scale: float, kid: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(dX, dY) of k(D) given dL/dC ``grad`` and C ``out`` (B, N, M)."""
    dx, dy, _ = _backward(x, y, grad.contiguous(), out, None, None, scale, kid)
    return dx, dy


@triton_op("laplacianformer::laplace_matmul_bwd", mutates_args=())
def laplace_matmul_bwd(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, grad: torch.Tensor, scale: float, kid: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dX, dY, dV) of k(D) @ V given dL/dO ``grad`` (B, N, e), recomputing C."""
    return _backward(x, y, None, None, v, grad.contiguous(), scale, kid)


register_kernel_autograd(laplace_kernel_fwd, laplace_kernel_bwd)
register_matmul_autograd(laplace_matmul_fwd, laplace_matmul_bwd)


def laplace_kernel_triton(x: torch.Tensor, y: torch.Tensor, lam: float, kid: int = 0) -> torch.Tensor:
    """k(x_i, y_j) of the kernel family with id ``kid`` (``KernelSpec.id``).  x: (..., N, d), y: (..., M, d) ->
    (..., N, M)."""
    out = laplace_kernel_fwd(flatten_batch(x), flatten_batch(y), -1.0 / float(lam), kid)
    return out.reshape(*x.shape[:-1], y.shape[-2])


def laplace_kernel_matmul_triton(
    x: torch.Tensor, y: torch.Tensor, v: torch.Tensor, lam: float, kid: int = 0
) -> torch.Tensor:
    """k(X, Y) @ V, fused, for the family with id ``kid``.  x: (..., N, d), y: (..., M, d), v: (..., M, e) ->
    (..., N, e)."""
    out = laplace_matmul_fwd(flatten_batch(x), flatten_batch(y), flatten_batch(v), -1.0 / float(lam), kid)
    return out.reshape(*x.shape[:-1], v.shape[-1])
