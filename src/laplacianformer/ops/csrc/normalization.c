/* Fused injective / inline normalisation of the Nyström factors on the CPU (DESIGN.md §4.3, §6); the
 * formulas are those of ops/normalization/fused.py, the calling code ops/normalization/cpu.py.
 * Plain C with OpenMP, no Python or torch headers, so it builds in a few seconds at first use.
 *
 * Per group (batch·head) g: c (nq, m) = C_q, k (nk, m) = C_k, w (m, m) = W⁺ or NULL (then k is B itself),
 * v (nk, e), and for the backward G = dL/dout (nq, e). Inputs have element strides (s*b, s*n, 1), w is
 * contiguous per group (stride swb, 0 = one W for every group); outputs and saved tensors are contiguous.
 * inj = 1: injective; inj = 0: inline (r = 1, no covariance, c not centred).
 *
 * Every pass walks rows in sub-blocks of RS rows: the rows are centred (and scaled) into a packed scratch
 * X (RS, ldm) (ldm = m rounded up to the vector width, zero padded), then
 * - rows × small matrix (mm_rows): a tile of RR rows × up to NVMAX vectors of output columns stays in
 *   registers while k runs over the reduced dimension, broadcasting X[r][k] (one FMA per loaded vector
 *   and row), with the epilogue (row scale, bias, store) fused;
 * - sums over rows (mm_tn): acc (P, ldq) += Xᵀ Y over the sub-block, with a tile of RP acc rows × up to
 *   NVMAX vectors in registers while r runs over the sub-block.
 * Sums over rows go to one slot per (group, chunk) task, and the slots are added in chunk order, so the
 * result does not depend on the thread count. One workspace holds the slots, the per-group workspaces and
 * each thread's scratch: the calling thread's, kept between calls (lf_scratch, lf_template.h); both entry
 * points return 0, or 1 when it could not grow.
 *
 * The second half of this file is a template, compiled once per scalar type through lf_instances.h. */
#ifndef LF_T

#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef RS
#define RS 32 /* rows per sub-block (packed scratch) */
#endif
#ifndef RR
#define RR 4 /* rows per register tile of mm_rows */
#endif
#ifndef RP
#define RP 4 /* acc rows per register tile of mm_tn */
#endif
#ifndef NVMAX
#define NVMAX 4 /* vectors of output columns per register tile */
#endif
#ifndef CHUNKS
#define CHUNKS 64 /* about this many (group, chunk) tasks per pass */
#endif
#ifndef CHUNK_MIN
#define CHUNK_MIN 128 /* rows per chunk at least: each chunk's partial sums cost about m (m + e) to clear and add */
#endif

#include "lf_template.h"
#define W ((int64_t)(VBYTES / sizeof(F)))

/* Rows per chunk of n rows over g groups: about CHUNKS tasks in all, at least CHUNK_MIN rows, a multiple of RS;
 * shape only (so the sums' order does not depend on the thread count). */
static int64_t lfn_chunk_rows(int64_t g, int64_t n) {
  int64_t per = MAX(1, (CHUNKS + g - 1) / MAX(1, g));
  int64_t rows = MAX(CHUNK_MIN, (MAX(1, n) + per - 1) / per);
  return (rows + RS - 1) / RS * RS;
}

#define LF_SELF "normalization.c"
#include "lf_instances.h"

#else /* template */

LF_VECTOR_TYPES

INLINE void FN(store_n_)(F *o, V v, int64_t n) {
  if (n >= W) {
    *(VU *)o = v;
  } else {
    for (int64_t i = 0; i < n; ++i) o[i] = v[i];
  }
}

/* Σ_j a[j] b[j] over n values (unaligned): W lanes of partial sums over the whole vectors of a and b, added
 * in a fixed tree, then the remaining values in order. A row's quadratic form or dot in one short dependency
 * chain instead of n; the same for every thread count. */
INLINE F FN(dot_)(const F *restrict a, const F *restrict b, int64_t n) {
  V acc = (V){0};
  int64_t j = 0;
  for (; j + W <= n; j += W) acc += *(const VU *)(a + j) * *(const VU *)(b + j);
  F lane[W];
  for (int t = 0; t < W; ++t) lane[t] = acc[t];
  for (int h = W / 2; h >= 1; h /= 2)
    for (int t = 0; t < h; ++t) lane[t] += lane[t + h];
  F s = lane[0];
  for (; j < n; ++j) s += a[j] * b[j];
  return s;
}

/* acc[r][:NV] += Σ_k X[r][k] B[k][j0 + t*W + :W] over the kn columns of X (ld ldx) and rows of B (ld ldb),
 * for RR rows; rows past `rows` read the last row. */
INLINE void FN(tile_acc_)(V acc[RR][NVMAX], const F *restrict x, int64_t ldx, int64_t kn, const F *restrict b,
                          int64_t ldb, int rows, int64_t j0, const int NV) {
  const F *xr[RR];
  for (int r = 0; r < RR; ++r) xr[r] = x + MIN(r, rows - 1) * ldx;
  for (int64_t kk = 0; kk < kn; ++kk) {
    const F *bk = b + kk * ldb + j0;
    V bv[NVMAX];
    for (int t = 0; t < NV; ++t) bv[t] = *(const V *)(bk + t * W);
    for (int r = 0; r < RR; ++r) {
      const F xv = xr[r][kk];
      for (int t = 0; t < NV; ++t) acc[r][t] += xv * bv[t];
    }
  }
}

/* out[r][0:q] = (Σ_k X1[r][k] B1[k][:] + Σ_k X2[r][k] B2[k][:]) * (scl ? scl[r] : 1) + (bias ? bias : 0)
 * for `rows` (<= RR) rows of the packed X1 (ld ldx1) and X2 (ld ldx2, or NULL), B1 (k1, ldb) and B2
 * (k2, ldb) packed and zero padded, NV vectors of columns from column j0; out rows of stride ldo, columns
 * >= q not stored. Rows past `rows` read the last row and are not stored. */
INLINE void FN(mm_tile_)(const F *restrict x1, int64_t ldx1, int64_t k1, const F *restrict b1,
                         const F *restrict x2, int64_t ldx2, int64_t k2, const F *restrict b2, int64_t ldb,
                         int rows, int64_t j0, const F *restrict scl, const F *restrict bias, F *restrict out,
                         int64_t ldo, int64_t q, const int NV) {
  V acc[RR][NVMAX];
  for (int r = 0; r < RR; ++r)
    for (int t = 0; t < NV; ++t) acc[r][t] = (V){0};
  FN(tile_acc_)(acc, x1, ldx1, k1, b1, ldb, rows, j0, NV);
  if (x2) FN(tile_acc_)(acc, x2, ldx2, k2, b2, ldb, rows, j0, NV);
  for (int r = 0; r < RR; ++r) {
    if (r >= rows) break;
    const F s = scl ? scl[r] : (F)1;
    for (int t = 0; t < NV; ++t) {
      const int64_t col = j0 + t * W;
      if (col >= q) break;
      V y = acc[r][t] * s;
      if (bias) y += *(const V *)(bias + col);
      FN(store_n_)(out + r * ldo + col, y, q - col);
    }
  }
}

#define LF_MT_ARGS const F *x1, int64_t ldx1, int64_t k1, const F *b1, const F *x2, int64_t ldx2, int64_t k2, \
                   const F *b2, int64_t ldb, int rows, int64_t j0, const F *scl, const F *bias, F *out,          \
                   int64_t ldo, int64_t q
#define LF_MT_DEF(NV) \
  static void FN(mt_##NV##_)(LF_MT_ARGS) { FN(mm_tile_)(x1, ldx1, k1, b1, x2, ldx2, k2, b2, ldb, rows, j0, scl, bias, out, ldo, q, NV); }
LF_MT_DEF(1) LF_MT_DEF(2) LF_MT_DEF(3) LF_MT_DEF(4)
#undef LF_MT_DEF
#undef LF_MT_ARGS

/* mm_tile_ over `rows` (<= RS) rows and all q columns (ldb = q rounded up to W). */
static void FN(mm_rows_)(const F *x1, int64_t ldx1, int64_t k1, const F *b1, const F *x2, int64_t ldx2,
                         int64_t k2, const F *b2, int64_t ldb, int64_t rows, const F *scl, const F *bias,
                         F *out, int64_t ldo, int64_t q) {
  for (int64_t r0 = 0; r0 < rows; r0 += RR) {
    const int rr = (int)MIN(RR, rows - r0);
    for (int64_t j0 = 0; j0 < q; j0 += NVMAX * W) {
      const int nv = (int)MIN(NVMAX, (q - j0 + W - 1) / W);
      const F *xa = x1 + r0 * ldx1, *xb = x2 ? x2 + r0 * ldx2 : NULL;
      const F *s = scl ? scl + r0 : NULL;
      F *o = out + r0 * ldo;
      switch (nv) {
        case 1: FN(mt_1_)(xa, ldx1, k1, b1, xb, ldx2, k2, b2, ldb, rr, j0, s, bias, o, ldo, q); break;
        case 2: FN(mt_2_)(xa, ldx1, k1, b1, xb, ldx2, k2, b2, ldb, rr, j0, s, bias, o, ldo, q); break;
        case 3: FN(mt_3_)(xa, ldx1, k1, b1, xb, ldx2, k2, b2, ldb, rr, j0, s, bias, o, ldo, q); break;
        default: FN(mt_4_)(xa, ldx1, k1, b1, xb, ldx2, k2, b2, ldb, rr, j0, s, bias, o, ldo, q); break;
      }
    }
  }
}

/* acc[p][j0 + :NV*W] += Σ_r X[r][p0 + p] Y[r][j0 + :] for p < RP, over `rows` rows of the packed X (ld ldx,
 * columns zero padded to a multiple of RP) and Y (ld ldy, zero padded); acc has ld lda. */
INLINE void FN(tn_tile_)(const F *restrict x, int64_t ldx, const F *restrict y, int64_t ldy, int64_t rows,
                         int64_t p0, int64_t j0, F *restrict acc, int64_t lda, const int NV) {
  V a[RP][NVMAX];
  for (int p = 0; p < RP; ++p)
    for (int t = 0; t < NV; ++t) a[p][t] = *(const V *)(acc + (p0 + p) * lda + j0 + t * W);
  for (int64_t r = 0; r < rows; ++r) {
    const F *xr = x + r * ldx + p0, *yr = y + r * ldy + j0;
    V yv[NVMAX];
    for (int t = 0; t < NV; ++t) yv[t] = *(const V *)(yr + t * W);
    for (int p = 0; p < RP; ++p) {
      const F xv = xr[p];
      for (int t = 0; t < NV; ++t) a[p][t] += xv * yv[t];
    }
  }
  for (int p = 0; p < RP; ++p)
    for (int t = 0; t < NV; ++t) *(V *)(acc + (p0 + p) * lda + j0 + t * W) = a[p][t];
}

#define LF_TN_DEF(NV)                                                                                          \
  static void FN(tn_##NV##_)(const F *x, int64_t ldx, const F *y, int64_t ldy, int64_t rows, int64_t p0,       \
                             int64_t j0, F *acc, int64_t lda) { FN(tn_tile_)(x, ldx, y, ldy, rows, p0, j0, acc, lda, NV); }
LF_TN_DEF(1) LF_TN_DEF(2) LF_TN_DEF(3) LF_TN_DEF(4)
#undef LF_TN_DEF

/* acc (pp, lda) += Xᵀ Y over `rows` rows: X (rows, ldx) with p columns (pp = p rounded up to RP <= ldx),
 * Y (rows, ldy) with q columns (lda = ldy = q rounded up to W). With `sym` (X = Y up to a row scale, so
 * the result is symmetric) only tiles reaching the diagonal or above are computed. */
static void FN(mm_tn_)(const F *x, int64_t ldx, int64_t p, const F *y, int64_t ldy, int64_t q, int64_t rows,
                       F *acc, int64_t lda, int sym) {
  for (int64_t p0 = 0; p0 < p; p0 += RP) {
    for (int64_t j0 = sym ? p0 / W * W : 0; j0 < q; j0 += NVMAX * W) {
      const int nv = (int)MIN(NVMAX, (q - j0 + W - 1) / W);
      switch (nv) {
        case 1: FN(tn_1_)(x, ldx, y, ldy, rows, p0, j0, acc, lda); break;
        case 2: FN(tn_2_)(x, ldx, y, ldy, rows, p0, j0, acc, lda); break;
        case 3: FN(tn_3_)(x, ldx, y, ldy, rows, p0, j0, acc, lda); break;
        default: FN(tn_4_)(x, ldx, y, ldy, rows, p0, j0, acc, lda); break;
      }
    }
  }
}

/* Rows i0..i0+rows of src (row stride sn) minus mu (or not, mu NULL), times scl[r] (or not), into the
 * packed dst (rows, ld), columns >= n zeroed. */
static void FN(pack_)(F *restrict dst, int64_t ld, const F *restrict src, int64_t sn, int64_t rows, int64_t n,
                      const F *restrict mu, const F *restrict scl) {
  for (int64_t r = 0; r < rows; ++r) {
    const F *s = src + r * sn;
    F *d = dst + r * ld;
    const F f = scl ? scl[r] : (F)1;
    if (mu)
      for (int64_t j = 0; j < n; ++j) d[j] = (s[j] - mu[j]) * f;
    else
      for (int64_t j = 0; j < n; ++j) d[j] = s[j] * f;
    for (int64_t j = n; j < ld; ++j) d[j] = 0;
  }
}

/* Small dense products: C (p, q) = alpha A B + beta C with A (p, k) or Aᵀ, B (k, q) or Bᵀ, row-major
 * with leading dimensions lda, ldb, ldc, register-tiled (mm_rows_) on packed copies of B (k, q rounded up
 * to W, zero padded) and alpha A (p, k) in ws (aligned, at least small_ws_ values for the p, q, k <= max(m, e)
 * of a call; beta != 0 also holds the product there before C is updated). */
static int64_t FN(small_ws_)(int64_t m, int64_t e) {
  const int64_t big = MAX(m, e), ld = (big + W - 1) / W * W;
  return 2 * big * ld + big * big;
}

static void FN(small_mm_)(int64_t p, int64_t q, int64_t kk, F alpha, const F *a, int64_t lda, int ta,
                          const F *b, int64_t ldb, int tb, F beta, F *c, int64_t ldc, F *ws) {
  const int64_t ldq = (q + W - 1) / W * W;
  F *bp = ws, *tmp = bp + kk * ldq, *ap = tmp + (beta != 0 ? p * ldq : 0);
  for (int64_t l = 0; l < kk; ++l)
    for (int64_t j = 0; j < ldq; ++j) bp[l * ldq + j] = j >= q ? 0 : tb ? b[j * ldb + l] : b[l * ldb + j];
  for (int64_t i = 0; i < p; ++i)
    for (int64_t l = 0; l < kk; ++l) ap[i * kk + l] = alpha * (ta ? a[l * lda + i] : a[i * lda + l]);
  if (beta == 0) {
    FN(mm_rows_)(ap, kk, kk, bp, NULL, 0, 0, NULL, ldq, p, NULL, NULL, c, ldc, q);
    return;
  }
  FN(mm_rows_)(ap, kk, kk, bp, NULL, 0, 0, NULL, ldq, p, NULL, NULL, tmp, ldq, q);
  for (int64_t i = 0; i < p; ++i)
    for (int64_t j = 0; j < q; ++j) c[i * ldc + j] = beta * c[i * ldc + j] + tmp[i * ldq + j];
}

/* The per-group small tensors saved between forward and backward, one block of `FN(stats_size_)` values
 * per group: c̄ (m), k̄ (m), S' (m, m), S W (m, m), M' (m, e), M (m, e), Σ_j r_j v_j (e), v̄ (e). */
typedef struct {
  F *cbar, *kbar, *sp, *sw, *mk, *mm, *rvs, *vbar;
} FN(stats_t);

static int64_t FN(stats_size_)(int64_t m, int64_t e) { return 2 * m + 2 * m * m + 2 * m * e + 2 * e; }

static FN(stats_t) FN(stats_at_)(F *base, int64_t gi, int64_t m, int64_t e) {
  FN(stats_t) s;
  F *p = base + gi * FN(stats_size_)(m, e);
  s.cbar = p; p += m;
  s.kbar = p; p += m;
  s.sp = p; p += m * m;
  s.sw = p; p += m * m;
  s.mk = p; p += m * e;
  s.mm = p; p += m * e;
  s.rvs = p; p += e;
  s.vbar = p;
  return s;
}

/* Sums the first `size` values of the slots (stride `stride`) of group gi's chunks 0..nch-1, in chunk
 * order, into dst. */
static void FN(reduce_slots_)(F *dst, const F *slots, int64_t gi, int64_t nch, int64_t stride, int64_t size) {
  memset(dst, 0, sizeof(F) * (size_t)size);
  for (int64_t ci = 0; ci < nch; ++ci) {
    const F *s = slots + (gi * nch + ci) * stride;
    for (int64_t j = 0; j < size; ++j) dst[j] += s[j];
  }
}

/* Forward. out (g, nq, e); t (g, nk, m) = k̃ S' saved for the backward, or NULL; stats (g, stats_size);
 * rinv (g, nk) = r; dsc (g, nk) = -r³/2 where s >= 0, else 0 (dr -> ds). inj = 0: t, rinv, dsc unused.
 * alpha: the output scale of DESIGN.md §4.6, out = v̄ + alpha (Z V − v̄) = (c − c̄)(alpha M) + v̄ (alpha M
 * packed for the out pass; the saved M stays unscaled); 1 for the unscaled output, bit for bit. */
int FN(lf_norm_fwd_)(const F *c, int64_t scb, int64_t scn, const F *k, int64_t skb, int64_t skn, const F *w,
                     int64_t swb, const F *v, int64_t svb, int64_t svn, int64_t g, int64_t nq, int64_t nk,
                     int64_t m, int64_t e, F eps, F alpha, int inj, F *out, F *t, F *stats, F *rinv, F *dsc,
                     int threads) {
  const int64_t ldm = (m + W - 1) / W * W, lde = (e + W - 1) / W * W, mp = (m + RP - 1) / RP * RP;
  const int64_t cq = lfn_chunk_rows(g, nq), ck = lfn_chunk_rows(g, nk);
  const int64_t nchq = (nq + cq - 1) / cq, nchk = (nk + ck - 1) / ck;
  /* slots: query chunks (S' sums (mp, ldm) + Σ d (ldm)); key chunks (Σ k (ldm)) then (M' (mp, lde) + Σ r v + Σ v) */
  const int64_t szq = mp * ldm + ldm, szk0 = ldm, szk = mp * lde + 2 * lde;
  const int64_t nslots = g * nchq * szq + g * nchk * MAX(szk0, szk);
  /* per group: pilot (ldm), S sums (mp + 1, ldm), packed S' (m, ldm), packed M (m, lde), bias v̄ (lde) */
  const int64_t o_s = ldm, o_spk = o_s + (mp + 1) * ldm, o_mpk = o_spk + m * ldm, o_bias = o_mpk + m * lde;
  const int64_t szg = o_bias + lde;
  const int64_t ldx = MAX(ldm, lde), smsz0 = (mp * ldx + 2 * ldx + 3 * m * m + m * e + 2 * m + W + 63) / 64 * 64;
  const int64_t smsz = smsz0 + FN(small_ws_)(m, e);
  /* each thread's scratch (carved below), whole multiples of 64 values apart */
  const int64_t szt = (RS * (3 * ldm + lde) + 2 * RS + smsz + 63) / 64 * 64;
  F *slots = (F *)lf_scratch(sizeof(F) * (size_t)(nslots + g * szg + MAX(1, threads) * szt));
  if (!slots) return 1;
  F *gws = slots + nslots, *thr = gws + g * szg;
  F *slq = slots, *slk = slots + g * nchq * szq;
  const int64_t szkk = MAX(szk0, szk);
#pragma omp parallel num_threads(threads)
  {
    F *xs = thr + omp_get_thread_num() * szt, *ts = xs + RS * ldm, *us = ts + RS * ldm;
    F *vs = us + RS * ldm, *rs = vs + RS * lde;
    F *sm = rs + 2 * RS; /* small per-group temporaries (acc, ksum, dbar, sfull) */
    F *mws = sm + smsz0; /* small_mm_'s workspace */
    /* 1. pilot of each group's c rows: the mean of about 64 evenly spaced rows (shift of the covariance) */
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < g; ++gi) {
      F *pilot = gws + gi * szg;
      memset(pilot, 0, sizeof(F) * (size_t)ldm);
      if (inj && nq > 0) {
        const int64_t step = MAX(1, nq / 64);
        int64_t cnt = 0;
        for (int64_t i = 0; i < nq; i += step, ++cnt)
          for (int64_t j = 0; j < m; ++j) pilot[j] += c[gi * scb + i * scn + j];
        for (int64_t j = 0; j < m; ++j) pilot[j] /= (F)cnt;
      }
    }
    /* 2. query chunks: Σ d dᵀ, Σ d (d = c − pilot); key chunks: Σ k */
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g * (nchq + nchk); ++task) {
      if (task < g * nchq) {
        if (!inj) continue;
        const int64_t gi = task / nchq, lo = (task % nchq) * cq, hi = MIN(nq, lo + cq);
        F *slot = slq + task * szq, *sd = slot + mp * ldm;
        memset(slot, 0, sizeof(F) * (size_t)szq);
        for (int64_t i = lo; i < hi; i += RS) {
          const int64_t rows = MIN(RS, hi - i);
          FN(pack_)(xs, ldm, c + gi * scb + i * scn, scn, rows, m, gws + gi * szg, NULL);
          FN(mm_tn_)(xs, ldm, m, xs, ldm, m, rows, slot, ldm, 1);
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < m; ++j) sd[j] += xs[r * ldm + j];
        }
      } else {
        const int64_t tk = task - g * nchq, gi = tk / nchk, lo = (tk % nchk) * ck, hi = MIN(nk, lo + ck);
        F *slot = slk + tk * szkk;
        memset(slot, 0, sizeof(F) * (size_t)szk0);
        for (int64_t i = lo; i < hi; ++i)
          for (int64_t j = 0; j < m; ++j) slot[j] += k[gi * skb + i * skn + j];
      }
    }
    /* 3. per group: c̄, S, k̄, S' = Wᵀ S W, S W (packed S' for the key pass) */
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < g; ++gi) {
      FN(stats_t) st = FN(stats_at_)(stats, gi, m, e);
      F *pilot = gws + gi * szg, *s = pilot + o_s, *spk = pilot + o_spk;
      F *ksum = sm, *dbar = ksum + m, *sfull = dbar + m;
      memset(ksum, 0, sizeof(F) * (size_t)m);
      for (int64_t ci = 0; ci < nchk; ++ci) {
        const F *sl = slk + (gi * nchk + ci) * szkk;
        for (int64_t j = 0; j < m; ++j) ksum[j] += sl[j];
      }
      for (int64_t j = 0; j < m; ++j) st.kbar[j] = nk > 0 ? ksum[j] / (F)nk : 0;
      if (inj) {
        FN(reduce_slots_)(s, slq, gi, nchq, szq, szq); /* (mp, ldm) upper tiles, then Σ d at s + mp*ldm */
        const F *dsum = s + mp * ldm;
        for (int64_t j = 0; j < m; ++j) dbar[j] = nq > 0 ? dsum[j] / (F)nq : 0;
        for (int64_t j = 0; j < m; ++j) st.cbar[j] = pilot[j] + dbar[j];
        /* S = D / nq − d̄ d̄ᵀ, symmetric: the upper part was accumulated (tiles from the diagonal's vector) */
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = i; j < m; ++j) {
            const F val = (nq > 0 ? s[i * ldm + j] / (F)nq : 0) - dbar[i] * dbar[j];
            sfull[i * m + j] = sfull[j * m + i] = val;
          }
        if (w) {
          const F *wg = w + gi * swb;
          FN(small_mm_)(m, m, m, 1, sfull, m, 0, wg, m, 0, 0, st.sw, m, mws);       /* S W */
          FN(small_mm_)(m, m, m, 1, wg, m, 1, st.sw, m, 0, 0, st.sp, m, mws);       /* Wᵀ S W */
        } else {
          memcpy(st.sw, sfull, sizeof(F) * (size_t)(m * m));
          memcpy(st.sp, sfull, sizeof(F) * (size_t)(m * m));
        }
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = 0; j < ldm; ++j) spk[i * ldm + j] = j < m ? st.sp[i * m + j] : 0;
      } else {
        memset(st.cbar, 0, sizeof(F) * (size_t)m);
        memset(st.sp, 0, sizeof(F) * (size_t)(m * m));
        memset(st.sw, 0, sizeof(F) * (size_t)(m * m));
      }
    }
    /* 4. key chunks: t = k̃ S', s = rowsum(t ⊙ k̃), r; sums (r ⊙ k̃)ᵀ v, Σ r v, Σ v */
#pragma omp for schedule(dynamic)
    for (int64_t tk = 0; tk < g * nchk; ++tk) {
      const int64_t gi = tk / nchk, lo = (tk % nchk) * ck, hi = MIN(nk, lo + ck);
      FN(stats_t) st = FN(stats_at_)(stats, gi, m, e);
      const F *spk = gws + gi * szg + o_spk;
      F *slot = slk + tk * szkk, *srv = slot + mp * lde, *sv = srv + lde;
      memset(slot, 0, sizeof(F) * (size_t)szk);
      for (int64_t i = lo; i < hi; i += RS) {
        const int64_t rows = MIN(RS, hi - i);
        FN(pack_)(xs, ldm, k + gi * skb + i * skn, skn, rows, m, st.kbar, NULL);
        FN(pack_)(vs, lde, v + gi * svb + i * svn, svn, rows, e, NULL, NULL);
        if (inj) {
          F *tr = t ? t + (gi * nk + i) * m : ts;
          const int64_t ldt = t ? m : ldm;
          FN(mm_rows_)(xs, ldm, m, spk, NULL, 0, 0, NULL, ldm, rows, NULL, NULL, tr, ldt, m);
          for (int64_t r = 0; r < rows; ++r) {
            const F sj = FN(dot_)(tr + r * ldt, xs + r * ldm, m);
            const F rj = (F)1 / (F)sqrt((double)((sj > 0 ? sj : 0) + eps));
            rs[r] = rj;
            rinv[gi * nk + i + r] = rj;
            dsc[gi * nk + i + r] = sj >= 0 ? (F)-0.5 * rj * rj * rj : 0;
          }
        } else {
          for (int64_t r = 0; r < rows; ++r) rs[r] = 1;
        }
        for (int64_t r = 0; r < rows; ++r) {
          F *ur = us + r * ldm;
          const F *xr = xs + r * ldm;
          for (int64_t j = 0; j < ldm; ++j) ur[j] = xr[j] * rs[r];
          const F *vr = vs + r * lde;
          for (int64_t j = 0; j < e; ++j) {
            srv[j] += rs[r] * vr[j];
            sv[j] += vr[j];
          }
        }
        FN(mm_tn_)(us, ldm, m, vs, lde, e, rows, slot, lde, 0);
      }
    }
    /* 5. per group: M', Σ r v, v̄, M = W M'; packed alpha M and the bias v̄ for the out pass */
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < g; ++gi) {
      FN(stats_t) st = FN(stats_at_)(stats, gi, m, e);
      F *mpk = gws + gi * szg + o_mpk, *bias = gws + gi * szg + o_bias;
      F *acc = sm;
      FN(reduce_slots_)(acc, slk, gi, nchk, szkk, szk);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < e; ++j) st.mk[i * e + j] = acc[i * lde + j];
      for (int64_t j = 0; j < e; ++j) {
        st.rvs[j] = acc[mp * lde + j];
        st.vbar[j] = nk > 0 ? acc[mp * lde + lde + j] / (F)nk : 0;
      }
      if (w)
        FN(small_mm_)(m, e, m, 1, w + gi * swb, m, 0, st.mk, e, 0, 0, st.mm, e, mws);
      else
        memcpy(st.mm, st.mk, sizeof(F) * (size_t)(m * e));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < lde; ++j) mpk[i * lde + j] = j < e ? alpha * st.mm[i * e + j] : 0;
      for (int64_t j = 0; j < lde; ++j) bias[j] = j < e ? st.vbar[j] : 0;
    }
    /* 6. query chunks: out = (c − c̄) (alpha M) + v̄ */
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g * nchq; ++task) {
      const int64_t gi = task / nchq, lo = (task % nchq) * cq, hi = MIN(nq, lo + cq);
      FN(stats_t) st = FN(stats_at_)(stats, gi, m, e);
      const F *mpk = gws + gi * szg + o_mpk, *bias = gws + gi * szg + o_bias;
      for (int64_t i = lo; i < hi; i += RS) {
        const int64_t rows = MIN(RS, hi - i);
        FN(pack_)(xs, ldm, c + gi * scb + i * scn, scn, rows, m, inj ? st.cbar : NULL, NULL);
        FN(mm_rows_)(xs, ldm, m, mpk, NULL, 0, 0, NULL, lde, rows, NULL, bias, out + (gi * nq + i) * e, e, e);
      }
    }
  }
  return 0;
}

/* Backward. grad (g, nq, e) with strides (sgb, sgn, 1); t: the forward's k̃ S' or NULL (recomputed);
 * dk may be t (written in place). dc (g, nq, m), dk (g, nk, m), dv (g, nk, e), dw (g, m, m) or NULL. */
int FN(lf_norm_bwd_)(const F *c, int64_t scb, int64_t scn, const F *k, int64_t skb, int64_t skn, const F *w,
                     int64_t swb, const F *v, int64_t svb, int64_t svn, const F *gr, int64_t sgb, int64_t sgn,
                     int64_t g, int64_t nq, int64_t nk, int64_t m, int64_t e, int inj, const F *stats,
                     const F *rinv, const F *dsc, const F *t, F *dc, F *dk, F *dw, F *dv, int threads) {
  const int64_t ldm = (m + W - 1) / W * W, lde = (e + W - 1) / W * W, mp = (m + RP - 1) / RP * RP;
  const int64_t cq = lfn_chunk_rows(g, nq), ck = lfn_chunk_rows(g, nk);
  const int64_t nchq = (nq + cq - 1) / cq, nchk = (nk + ck - 1) / ck;
  const int64_t szq = mp * lde + lde, szk = mp * ldm + ldm;
  const int64_t nslots = g * nchq * szq + g * nchk * szk;
  /* per group: dM' packed (m, lde), dM'ᵀ packed (e, ldm), Ḡ_k (lde), S' packed (m, ldm), dk mean (ldm),
   * (2/nq) dS packed (m, ldm), Mᵀ packed (e, ldm), dc bias (ldm), dM (m, e), dS' (m, m) */
  const int64_t szg = (m * lde + e * ldm + lde + m * ldm + ldm + m * ldm + e * ldm + ldm + m * e + m * m + W - 1) / W * W;
  const int64_t ldx = MAX(ldm, lde), smsz0 = (mp * ldx + 2 * ldx + 3 * m * m + m * e + 2 * m + W + 63) / 64 * 64;
  const int64_t smsz = smsz0 + FN(small_ws_)(m, e);
  /* each thread's scratch (carved below), whole multiples of 64 values apart */
  const int64_t szt = (RS * (4 * ldm + lde) + 2 * RS + smsz + 63) / 64 * 64;
  F *slots = (F *)lf_scratch(sizeof(F) * (size_t)(nslots + g * szg + MAX(1, threads) * szt));
  if (!slots) return 1;
  F *slq = slots, *slk = slots + g * nchq * szq, *gws = slots + nslots, *thr = gws + g * szg;
#pragma omp parallel num_threads(threads)
  {
    F *xs = thr + omp_get_thread_num() * szt, *ys = xs + RS * ldm, *us = ys + RS * ldm;
    F *ts = us + RS * ldm, *vs = ts + RS * ldm;
    F *dss = vs + RS * lde, *sm = dss + 2 * RS; /* small per-group temporaries */
    F *mws = sm + smsz0; /* small_mm_'s workspace */
    /* 1. query chunks: dM = Σ (c − c̄)ᵀ G, Σ G */
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g * nchq; ++task) {
      const int64_t gi = task / nchq, lo = (task % nchq) * cq, hi = MIN(nq, lo + cq);
      FN(stats_t) st = FN(stats_at_)((F *)stats, gi, m, e);
      F *slot = slq + task * szq, *sg = slot + mp * lde;
      memset(slot, 0, sizeof(F) * (size_t)szq);
      for (int64_t i = lo; i < hi; i += RS) {
        const int64_t rows = MIN(RS, hi - i);
        FN(pack_)(xs, ldm, c + gi * scb + i * scn, scn, rows, m, inj ? st.cbar : NULL, NULL);
        FN(pack_)(vs, lde, gr + gi * sgb + i * sgn, sgn, rows, e, NULL, NULL);
        FN(mm_tn_)(xs, ldm, m, vs, lde, e, rows, slot, lde, 0);
        for (int64_t r = 0; r < rows; ++r)
          for (int64_t j = 0; j < e; ++j) sg[j] += vs[r * lde + j];
      }
    }
    /* 2. per group: dM, dM' = Wᵀ dM, Ḡ_k; packed dM', dM'ᵀ, S' */
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < g; ++gi) {
      FN(stats_t) st = FN(stats_at_)((F *)stats, gi, m, e);
      F *g0 = gws + gi * szg, *dmk = g0, *dmkt = dmk + m * lde, *gk = dmkt + e * ldm, *spk = gk + lde;
      F *dmm = spk + m * ldm + ldm + m * ldm + e * ldm + ldm;
      F *acc = sm, *dmp = sm + mp * ldx + 2 * ldx;
      FN(reduce_slots_)(acc, slq, gi, nchq, szq, szq);
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < e; ++j) dmm[i * e + j] = acc[i * lde + j];
      if (w)
        FN(small_mm_)(m, e, m, 1, w + gi * swb, m, 1, dmm, e, 0, 0, dmp, e, mws);
      else
        memcpy(dmp, dmm, sizeof(F) * (size_t)(m * e));
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < lde; ++j) dmk[i * lde + j] = j < e ? dmp[i * e + j] : 0;
      for (int64_t j = 0; j < e; ++j)
        for (int64_t i = 0; i < ldm; ++i) dmkt[j * ldm + i] = i < m ? dmp[i * e + j] : 0;
      for (int64_t j = 0; j < lde; ++j) gk[j] = j < e && nk > 0 ? acc[mp * lde + j] / (F)nk : 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldm; ++j) spk[i * ldm + j] = j < m ? st.sp[i * m + j] : 0;
    }
    /* 3. key chunks: dv = r (k̃ dM') + Ḡ_k, Y = v dM'ᵀ, ds = dsc (Y · k̃), dk̃ = r Y + 2 ds t,
     *    sums k̃ᵀ (ds k̃) and Σ ds k̃ */
#pragma omp for schedule(dynamic)
    for (int64_t tk = 0; tk < g * nchk; ++tk) {
      const int64_t gi = tk / nchk, lo = (tk % nchk) * ck, hi = MIN(nk, lo + ck);
      FN(stats_t) st = FN(stats_at_)((F *)stats, gi, m, e);
      const F *g0 = gws + gi * szg, *dmk = g0, *dmkt = dmk + m * lde, *gk = dmkt + e * ldm, *spk = gk + lde;
      F *slot = slk + tk * szk, *su = slot + mp * ldm;
      memset(slot, 0, sizeof(F) * (size_t)szk);
      for (int64_t i = lo; i < hi; i += RS) {
        const int64_t rows = MIN(RS, hi - i);
        const F *ri = inj ? rinv + gi * nk + i : NULL;
        FN(pack_)(xs, ldm, k + gi * skb + i * skn, skn, rows, m, st.kbar, NULL);
        FN(pack_)(vs, lde, v + gi * svb + i * svn, svn, rows, e, NULL, NULL);
        FN(mm_rows_)(xs, ldm, m, dmk, NULL, 0, 0, NULL, lde, rows, ri, gk, dv + (gi * nk + i) * e, e, e);
        FN(mm_rows_)(vs, lde, e, dmkt, NULL, 0, 0, NULL, ldm, rows, NULL, NULL, ys, ldm, m);
        F *dkr = dk + (gi * nk + i) * m;
        if (!inj) {
          for (int64_t r = 0; r < rows; ++r) memcpy(dkr + r * m, ys + r * ldm, sizeof(F) * (size_t)m);
          continue;
        }
        const F *tr = t ? t + (gi * nk + i) * m : ts;
        const int64_t ldt = t ? m : ldm;
        if (!t) FN(mm_rows_)(xs, ldm, m, spk, NULL, 0, 0, NULL, ldm, rows, NULL, NULL, ts, ldm, m);
        for (int64_t r = 0; r < rows; ++r) {
          const F *yr = ys + r * ldm, *xr = xs + r * ldm, *trr = tr + r * ldt;
          const F dr = FN(dot_)(yr, xr, m);
          const F ds = dsc[gi * nk + i + r] * dr, rj = ri[r];
          dss[r] = ds;
          F *o = dkr + r * m; /* may alias trr (dk = t): each element is read before it is written */
          for (int64_t j = 0; j < m; ++j) o[j] = rj * yr[j] + 2 * ds * trr[j];
          for (int64_t j = 0; j < m; ++j) su[j] += ds * xr[j];
        }
        FN(pack_)(us, ldm, xs, ldm, rows, m, NULL, dss);
        FN(mm_tn_)(us, ldm, m, xs, ldm, m, rows, slot, ldm, 1);
      }
    }
    /* 4. per group: dS', Σu; dk mean; dS = W dS' Wᵀ; dW = dM M'ᵀ + 2 S W dS'; packed (2/nq) dS, Mᵀ, bias */
#pragma omp for schedule(static)
    for (int64_t gi = 0; gi < g; ++gi) {
      FN(stats_t) st = FN(stats_at_)((F *)stats, gi, m, e);
      F *g0 = gws + gi * szg, *dmk = g0, *dmkt = dmk + m * lde, *gk = dmkt + e * ldm, *spk = gk + lde;
      F *dkm = spk + m * ldm, *dsk = dkm + ldm, *mtk = dsk + m * ldm, *dcb = mtk + e * ldm;
      F *dmm = dcb + ldm, *dsp = dmm + m * e;
      (void)dmk;
      F *acc = sm, *dsf = sm + mp * ldx + 2 * ldx, *tmp = dsf + m * m;
      memset(dkm, 0, sizeof(F) * (size_t)ldm);
      if (inj) {
        FN(reduce_slots_)(acc, slk, gi, nchk, szk, szk);
        for (int64_t i = 0; i < m; ++i)
          for (int64_t j = i; j < m; ++j) dsp[i * m + j] = dsp[j * m + i] = acc[i * ldm + j];
        /* mean_j dk̃_j = (Σ r v) dM'ᵀ / nk + 2 (Σ u) S' / nk */
        const F *su = acc + mp * ldm;
        for (int64_t j = 0; j < m; ++j) {
          F a = 0;
          for (int64_t l = 0; l < e; ++l) a += st.rvs[l] * dmkt[l * ldm + j];
          for (int64_t l = 0; l < m; ++l) a += 2 * su[l] * st.sp[l * m + j];
          dkm[j] = nk > 0 ? a / (F)nk : 0;
        }
        if (w) {
          const F *wg = w + gi * swb;
          FN(small_mm_)(m, m, m, 1, wg, m, 0, dsp, m, 0, 0, tmp, m, mws);   /* W dS' */
          FN(small_mm_)(m, m, m, 1, tmp, m, 0, wg, m, 1, 0, dsf, m, mws);   /* (W dS') Wᵀ */
        } else {
          memcpy(dsf, dsp, sizeof(F) * (size_t)(m * m));
        }
      } else {
        for (int64_t j = 0; j < m; ++j) {
          F a = 0;
          for (int64_t l = 0; l < e; ++l) a += st.vbar[l] * dmkt[l * ldm + j];
          dkm[j] = a; /* inline: dk = Y − mean Y, mean Y = v̄ dM'ᵀ */
        }
        memset(dsf, 0, sizeof(F) * (size_t)(m * m));
        memset(dsp, 0, sizeof(F) * (size_t)(m * m));
      }
      if (dw) {
        F *dwg = dw + gi * m * m;
        FN(small_mm_)(m, m, e, 1, dmm, e, 0, st.mk, e, 1, 0, dwg, m, mws);          /* dM M'ᵀ */
        if (inj) FN(small_mm_)(m, m, m, 2, st.sw, m, 0, dsp, m, 0, 1, dwg, m, mws); /* + 2 S W dS' */
      }
      const F sc = nq > 0 ? (F)2 / (F)nq : 0;
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < ldm; ++j) dsk[i * ldm + j] = j < m ? sc * dsf[i * m + j] : 0;
      for (int64_t l = 0; l < e; ++l)
        for (int64_t j = 0; j < ldm; ++j) mtk[l * ldm + j] = j < m ? st.mm[j * e + l] : 0;
      /* dc bias: −Ḡ_q Mᵀ (injective: the mean of dc̃ removed); inline: none */
      for (int64_t j = 0; j < ldm; ++j) {
        F a = 0;
        if (inj && j < m && nq > 0)
          for (int64_t l = 0; l < e; ++l) a += gk[l] * (F)nk / (F)nq * st.mm[j * e + l];
        dcb[j] = -a;
      }
    }
    /* 5. query chunks: dc = (c − c̄) (2/nq) dS + G Mᵀ − Ḡ_q Mᵀ; key chunks: dk −= mean */
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < g * (nchq + nchk); ++task) {
      if (task < g * nchq) {
        const int64_t gi = task / nchq, lo = (task % nchq) * cq, hi = MIN(nq, lo + cq);
        FN(stats_t) st = FN(stats_at_)((F *)stats, gi, m, e);
        const F *g0 = gws + gi * szg, *spk = g0 + m * lde + e * ldm + lde;
        const F *dsk = spk + m * ldm + ldm, *mtk = dsk + m * ldm, *dcb = mtk + e * ldm;
        for (int64_t i = lo; i < hi; i += RS) {
          const int64_t rows = MIN(RS, hi - i);
          FN(pack_)(vs, lde, gr + gi * sgb + i * sgn, sgn, rows, e, NULL, NULL);
          if (inj) {
            FN(pack_)(xs, ldm, c + gi * scb + i * scn, scn, rows, m, st.cbar, NULL);
            FN(mm_rows_)(xs, ldm, m, dsk, vs, lde, e, mtk, ldm, rows, NULL, dcb, dc + (gi * nq + i) * m, m, m);
          } else {
            FN(mm_rows_)(vs, lde, e, mtk, NULL, 0, 0, NULL, ldm, rows, NULL, NULL, dc + (gi * nq + i) * m, m, m);
          }
        }
      } else {
        const int64_t tk = task - g * nchq, gi = tk / nchk, lo = (tk % nchk) * ck, hi = MIN(nk, lo + ck);
        const F *dkm = gws + gi * szg + m * lde + e * ldm + lde + m * ldm;
        for (int64_t i = lo; i < hi; ++i) {
          F *o = dk + (gi * nk + i) * m;
          for (int64_t j = 0; j < m; ++j) o[j] -= dkm[j];
        }
      }
    }
  }
  return 0;
}

#endif
