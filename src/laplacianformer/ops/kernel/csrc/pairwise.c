/* Pairwise-distance loops of the CPU path (DESIGN.md §1, §6); formulas in ops/kernel/cpu.py.
 * Plain C with OpenMP, no Python or torch headers, so it builds in a few seconds at first use.
 *
 * x: (B, N, d) with element strides (sxb, sxn, 1); y: (B, M, d) with strides (syb, sym, 1); g, c, out:
 * contiguous (B, N, M); dx: (B, N, d) with strides (sdb, sdn, 1); dy: contiguous (B, M, d).
 * lf_dist_*: out = scale * D, D the L1 (l1 != 0) or squared-L2 distance.
 * lf_grad_*: with dL/dD = g * c * scale (c may be NULL: dL/dD = g * scale), dx and dy. The rows of each
 * batch are cut into `chunks` chunks of `rows_per_chunk` rows; each chunk sums its dY part into its own
 * slot and the slots are added in chunk order, so the result does not depend on the thread count.
 * sign(0) = 0. Both return 0, or 1 when the workspace (the calling thread's, kept between calls: lf_scratch)
 * could not grow.
 *
 * Vectors are GCC vector extensions of VBYTES bytes (64 with AVX-512, else 32; GCC splits them where the
 * machine's vectors are narrower), W lanes; AVX-512 intrinsics only where noted, with a plain fallback.
 * Forward: y is packed transposed per batch, (d, mp) with mp the tiled columns padded with zeros; a block
 * of RF query rows x up to TF column tiles of W lanes stays in registers while k runs over d, broadcasting
 * x[r][k] (3 vector operations per W terms for L1: sub, and, add). When only a few columns are left over
 * past the full tiles (m % W), they are computed one (row, column) pair at a time, vectorised over d,
 * instead of as a mostly padded tile.
 * Backward: vectorised over d (y packed (M, dp), dp = d padded to W with zeros); a block of RB rows x up
 * to DV vectors of d keeps its dX in registers while j runs over M, and each dY_j update (a register sum
 * over the RB rows, then one read-modify-write of the slot) serves the RB rows. L1 costs 4 operations per
 * W terms with AVX-512 (sub, vfixupimm for sign, two FMAs with dL/dD), 6 without.
 * Row remainders run the full block with the last row repeated (dL/dD = 0 in the backward), not stored,
 * so there is one specialisation per tile count only.
 *
 * The second half of this file is a template: it includes itself (through __FILE__, so it must be
 * compiled by an absolute path) once per scalar type. */
#ifndef LF_T

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#if defined(__AVX512F__)
#include <immintrin.h>
#define VBYTES 64
#else
#define VBYTES 32
#endif
#ifndef RF
#define RF (VBYTES == 64 ? 4 : 3) /* forward rows per block */
#endif
#ifndef TF /* forward column tiles per block (a literal: LF_SPECS pastes it) */
#if VBYTES == 64
#define TF 4
#else
#define TF 3
#endif
#endif
#ifndef RB
#define RB (VBYTES == 64 ? 4 : 3) /* backward rows per block */
#endif
#ifndef DV /* backward vectors of d per pass (a literal: LF_SPECS pastes it) */
#if VBYTES == 64
#define DV 4
#else
#define DV 2
#endif
#endif
#ifndef JC
#define JC 128 /* backward columns of dL/dD formed at a time */
#endif

#include "../../csrc/lf_template.h"
#define W ((int)(VBYTES / sizeof(F)))
#define VI FN(ivec_) /* the integer vector of V's width (LF_I lanes) */

/* DEF(n, 0) DEF(n, 1) for n = 1 .. N (a literal, at most 4): the specialisations of a tile function by
 * count (column tiles or vectors of d) and distance (l1 = 0, 1). */
#define LF_SPECS_1(DEF) DEF(1, 0) DEF(1, 1)
#define LF_SPECS_2(DEF) LF_SPECS_1(DEF) DEF(2, 0) DEF(2, 1)
#define LF_SPECS_3(DEF) LF_SPECS_2(DEF) DEF(3, 0) DEF(3, 1)
#define LF_SPECS_4(DEF) LF_SPECS_3(DEF) DEF(4, 0) DEF(4, 1)
#define LF_SPECS(N, DEF) CAT(LF_SPECS_, N)(DEF)

#define LF_T float
#define LF_I int32_t
#define LF_SFX f32
#define LF_ABSBITS 0x7fffffff
#include __FILE__
#undef LF_T
#undef LF_I
#undef LF_SFX
#undef LF_ABSBITS

#define LF_T double
#define LF_I int64_t
#define LF_SFX f64
#define LF_ABSBITS 0x7fffffffffffffffLL
#include __FILE__

#else /* template: LF_T the scalar type, LF_I the integer of the same width */

LF_VECTOR_TYPES
typedef LF_I VI __attribute__((vector_size(VBYTES)));

INLINE V FN(vabs_)(V u) { return (V)((VI)u & (VI)((VI){0} + (LF_I)LF_ABSBITS)); }

INLINE V FN(bcast_)(F s) {
  V v;
  for (int i = 0; i < W; ++i) v[i] = s;
  return v;
}

/* sign(u) * gv lane-wise, sign(0) = 0 (gv holds one value in every lane; a NaN u gives +-gv). */
INLINE V FN(vsign_)(V u, V gv) {
  const VI sign = ~((VI){0} + (LF_I)LF_ABSBITS);
  return (V)((((VI)u & sign) ^ (VI)gv) & (VI)(u != 0));
}

#if defined(__AVX512F__)
/* sign(u) lane-wise in one instruction (vfixupimm): -1, +0 or +1, NaN stays NaN. Table nibbles by input
 * class: QNaN, SNaN -> QNaN(u); zero -> +0; +1, +inf, positive -> +1; -inf, negative -> -1. */
INLINE V FN(vsgn_)(V u) {
  if (sizeof(F) == 4)
    return (V)_mm512_fixupimm_ps((__m512)u, (__m512)u, _mm512_set1_epi32((int)0xA9A9A822), 0);
  return (V)_mm512_fixupimm_pd((__m512d)u, (__m512d)u, _mm512_set1_epi64(0xA9A9A822), 0);
}
#endif

INLINE F FN(hsum_)(V v) {
#if defined(__AVX512F__)
  if (sizeof(F) == 4) return (F)_mm512_reduce_add_ps((__m512)v);
  return (F)_mm512_reduce_add_pd((__m512d)v);
#else
  F a[VBYTES / sizeof(F)];
  memcpy(a, &v, sizeof v);
  for (int w = W / 2; w > 0; w /= 2)
    for (int i = 0; i < w; ++i) a[i] += a[i + w];
  return a[0];
#endif
}

/* The first n (< W) lanes of v into o. */
INLINE void FN(store_part_)(F *o, V v, int64_t n) {
#if defined(__AVX512F__)
  if (sizeof(F) == 4)
    _mm512_mask_storeu_ps(o, (__mmask16)((1u << n) - 1), (__m512)v);
  else
    _mm512_mask_storeu_pd(o, (__mmask8)((1u << n) - 1), (__m512d)v);
#else
  for (int64_t i = 0; i < n; ++i) o[i] = v[i];
#endif
}

/* out[r][j0 + t*W + w] = scale * D for the first `rows` (<= RF) rows of x (row stride sxn) against NT
 * column tiles of the packed yt (d, mp) from column j0; out has row stride m, columns >= m are not stored.
 * Rows past `rows` repeat the last one and are not stored (one specialisation per NT). */
INLINE void FN(dist_tile_)(const F *restrict x, int64_t sxn, int rows, const F *restrict yt, int64_t mp,
                           int64_t d, F *restrict out, int64_t m, int64_t j0, F scale, const int l1,
                           const int NT) {
  const F *xr[RF];
  V acc[RF][TF];
  for (int r = 0; r < RF; ++r) {
    xr[r] = x + MIN(r, rows - 1) * sxn;
    for (int t = 0; t < NT; ++t) acc[r][t] = (V){0};
  }
  const F *yk = yt + j0;
  for (int64_t k = 0; k < d; ++k, yk += mp) {
    V yv[TF];
    for (int t = 0; t < NT; ++t) yv[t] = *(const VU *)(yk + t * W);
    for (int r = 0; r < RF; ++r) {
      const F xv = xr[r][k];
      for (int t = 0; t < NT; ++t) {
        const V u = yv[t] - xv;
        acc[r][t] += l1 ? FN(vabs_)(u) : u * u;
      }
    }
  }
  for (int r = 0; r < RF; ++r) {
    if (r >= rows) break;
    for (int t = 0; t < NT; ++t) {
      F *o = out + r * m + j0 + t * W;
      const int64_t left = m - (j0 + t * W);
      if (left >= W)
        *(VU *)o = acc[r][t] * scale;
      else
        FN(store_part_)(o, acc[r][t] * scale, left);
    }
  }
}

#define LF_DT_ARGS const F *x, int64_t sxn, int rows, const F *yt, int64_t mp, int64_t d, F *out, int64_t m, \
                   int64_t j0, F scale
#define LF_DT_DEF(NT, L)                                                                         \
  static void FN(dt_##NT##_##L##_)(LF_DT_ARGS) {                                                 \
    FN(dist_tile_)(x, sxn, rows, yt, mp, d, out, m, j0, scale, L, NT);                           \
  }
LF_SPECS(TF, LF_DT_DEF)
#undef LF_DT_DEF
#undef LF_DT_ARGS

/* D between one row of x and one row of y, vectorised over d. */
INLINE F FN(dist_pair_)(const F *restrict x, const F *restrict y, int64_t d, const int l1) {
  V a0 = (V){0}, a1 = (V){0};
  int64_t k = 0;
  for (; k + 2 * W <= d; k += 2 * W) {
    const V u0 = *(const VU *)(x + k) - *(const VU *)(y + k);
    const V u1 = *(const VU *)(x + k + W) - *(const VU *)(y + k + W);
    a0 += l1 ? FN(vabs_)(u0) : u0 * u0;
    a1 += l1 ? FN(vabs_)(u1) : u1 * u1;
  }
  for (; k + W <= d; k += W) {
    const V u = *(const VU *)(x + k) - *(const VU *)(y + k);
    a0 += l1 ? FN(vabs_)(u) : u * u;
  }
  F s = FN(hsum_)(a0 + a1);
  for (; k < d; ++k) {
    const F u = x[k] - y[k];
    s += l1 ? (u < 0 ? -u : u) : u * u;
  }
  return s;
}

int FN(lf_dist_)(const F *x, int64_t sxb, int64_t sxn, const F *y, int64_t syb, int64_t sym, F *out,
                 int64_t b, int64_t n, int64_t m, int64_t d, F scale, int l1, int threads) {
  const int64_t full = m / W, rem = m % W;
  /* Leftover columns one pair at a time (measured: about 3 d / W + 20 vector operations each per row)
   * when that is cheaper than a padded tile (3 d per row). */
  const int pairs = rem > 0 && d >= W && rem * (3 * (d / W) + 20 + 3 * (d % W)) < 3 * d;
  const int64_t nt = full + (rem > 0 && !pairs);
  const int64_t mp = nt * W;
  F *yt = NULL;
  if (nt > 0 && !(yt = (F *)lf_scratch(sizeof(F) * (size_t)(b * d * mp)))) return 1;
  const int64_t nblk = (n + RF - 1) / RF;
#pragma omp parallel num_threads(threads)
  {
    if (nt > 0) {
#pragma omp for schedule(static)
      for (int64_t bi = 0; bi < b; ++bi) {
        F *ytb = yt + bi * d * mp;
        const F *yb = y + bi * syb;
        for (int64_t k = 0; k < d; ++k)
          for (int64_t j = 0; j < mp; ++j) ytb[k * mp + j] = j < m ? yb[j * sym + k] : 0;
      }
    }
#pragma omp for schedule(static)
    for (int64_t task = 0; task < b * nblk; ++task) {
      const int64_t bi = task / nblk, i0 = (task % nblk) * RF;
      const int rows = (int)MIN(RF, n - i0);
      const F *xr = x + bi * sxb + i0 * sxn;
      F *o = out + (bi * n + i0) * m;
      for (int64_t g = 0; g < nt; g += TF) {
        const F *ytb = yt + bi * d * mp;
        const int64_t j0 = g * W;
        switch ((int)MIN(TF, nt - g)) {
          case 1: (l1 ? FN(dt_1_1_) : FN(dt_1_0_))(xr, sxn, rows, ytb, mp, d, o, m, j0, scale); break;
          case 2: (l1 ? FN(dt_2_1_) : FN(dt_2_0_))(xr, sxn, rows, ytb, mp, d, o, m, j0, scale); break;
#if TF >= 3
          case 3: (l1 ? FN(dt_3_1_) : FN(dt_3_0_))(xr, sxn, rows, ytb, mp, d, o, m, j0, scale); break;
#endif
#if TF >= 4
          case 4: (l1 ? FN(dt_4_1_) : FN(dt_4_0_))(xr, sxn, rows, ytb, mp, d, o, m, j0, scale); break;
#endif
          default: break;
        }
      }
      if (pairs) {
        const F *yb = y + bi * syb;
        for (int r = 0; r < rows; ++r)
          for (int64_t j = full * W; j < m; ++j)
            o[r * m + j] = scale * (l1 ? FN(dist_pair_)(xr + r * sxn, yb + j * sym, d, 1)
                                       : FN(dist_pair_)(xr + r * sxn, yb + j * sym, d, 0));
      }
    }
  }
  return 0;
}

/* gb[r][:jn] = g[r][:jn] * c[r][:jn] * gscale (c NULL: 1) for the first `rows` rows (stride m), 0 after. */
static void FN(grad_scale_)(F gb[RB][JC], const F *restrict g, const F *restrict c, int64_t m, int rows, int jn,
                            F gscale) {
  for (int r = 0; r < RB; ++r) {
    const F *gr = g + r * m, *cr = c ? c + r * m : NULL;
    if (r >= rows)
      for (int jj = 0; jj < jn; ++jj) gb[r][jj] = 0;
    else if (cr)
      for (int jj = 0; jj < jn; ++jj) gb[r][jj] = gr[jj] * cr[jj] * gscale;
    else
      for (int jj = 0; jj < jn; ++jj) gb[r][jj] = gr[jj] * gscale;
  }
}

/* For the first `rows` (<= RB) rows and NV vectors of d (x, yp, dx, dys already offset to the first
 * column): dx rows (stride sdn) = sum_j s_rj, dys rows (stride dp) += sum_r s_rj,
 * s_rj = dL/dD_rj * sign(x_r - y_j) (or 2 (x_r - y_j)); g, c: rows of stride m. dL/dD is formed JC
 * columns at a time in gb. Rows past `rows` repeat the last x row with dL/dD = 0 and are not stored. */
INLINE void FN(grad_block_)(const F *restrict x, int64_t sxn, int rows, const F *restrict yp, int64_t dp,
                            const F *restrict g, const F *restrict c, int64_t m, F scale, F *restrict dx,
                            int64_t sdn, F *restrict dys, const int l1, const int NV) {
  const F *xr[RB];
  V dxa[RB][DV];
  F gb[RB][JC];
  for (int r = 0; r < RB; ++r) {
    xr[r] = x + MIN(r, rows - 1) * sxn;
    for (int v = 0; v < NV; ++v) dxa[r][v] = (V){0};
  }
  const F gscale = l1 ? scale : 2 * scale;
  for (int64_t j0 = 0; j0 < m; j0 += JC) {
    const int jn = (int)MIN(JC, m - j0);
    FN(grad_scale_)(gb, g + j0, c ? c + j0 : NULL, m, rows, jn, gscale);
    for (int jj = 0; jj < jn; ++jj) {
      const F *yj = yp + (j0 + jj) * dp;
      V yv[DV], dya[DV];
      for (int v = 0; v < NV; ++v) {
        yv[v] = *(const VU *)(yj + v * W);
        dya[v] = (V){0};
      }
      for (int r = 0; r < RB; ++r) {
        const F gr = gb[r][jj];
        for (int v = 0; v < NV; ++v) {
          const V u = *(const VU *)(xr[r] + v * W) - yv[v];
          if (l1) {
#if defined(__AVX512F__)
            const V sg = FN(vsgn_)(u); /* -1, 0, +1 */
            dxa[r][v] += sg * gr;
            dya[v] += sg * gr;
#else
            const V s = FN(vsign_)(u, FN(bcast_)(gr));
            dxa[r][v] += s;
            dya[v] += s;
#endif
          } else {
            dxa[r][v] += u * gr;
            dya[v] += u * gr;
          }
        }
      }
      F *dyj = dys + (j0 + jj) * dp;
      for (int v = 0; v < NV; ++v) *(VU *)(dyj + v * W) += dya[v];
    }
  }
  for (int r = 0; r < RB; ++r) {
    if (r >= rows) break;
    for (int v = 0; v < NV; ++v) *(VU *)(dx + r * sdn + v * W) = dxa[r][v];
  }
}

#define LF_GB_ARGS const F *x, int64_t sxn, int rows, const F *yp, int64_t dp, const F *g, const F *c, \
                   int64_t m, F scale, F *dx, int64_t sdn, F *dys
#define LF_GB_DEF(NV, L)                                                                         \
  static void FN(gb_##NV##_##L##_)(LF_GB_ARGS) {                                                 \
    FN(grad_block_)(x, sxn, rows, yp, dp, g, c, m, scale, dx, sdn, dys, L, NV);                  \
  }
LF_SPECS(DV, LF_GB_DEF)
#undef LF_GB_DEF
#undef LF_GB_ARGS

int FN(lf_grad_)(const F *x, int64_t sxb, int64_t sxn, const F *y, int64_t syb, int64_t sym, const F *g,
                 const F *c, F *dx, int64_t sdb, int64_t sdn, F *dy, int64_t b, int64_t n, int64_t m,
                 int64_t d, int64_t chunks, int64_t rows_per_chunk, F scale, int l1, int threads) {
  const int64_t dp = (d + W - 1) / W * W, dfull = d / W * W;
  F *ypad = (F *)lf_scratch(sizeof(F) * (size_t)(b * m * dp + b * chunks * m * dp));
  if (!ypad) return 1;
  F *slots = ypad + b * m * dp;
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(static)
    for (int64_t bj = 0; bj < b * m; ++bj) {
      const F *src = y + (bj / m) * syb + (bj % m) * sym;
      F *dst = ypad + bj * dp;
      memcpy(dst, src, sizeof(F) * (size_t)d);
      for (int64_t k = d; k < dp; ++k) dst[k] = 0;
    }
#pragma omp for schedule(dynamic)
    for (int64_t task = 0; task < b * chunks; ++task) {
      const int64_t bi = task / chunks, lo = (task % chunks) * rows_per_chunk;
      const int64_t hi = MIN(n, lo + rows_per_chunk);
      F *slot = slots + task * m * dp;
      const F *yb = ypad + bi * m * dp;
      memset(slot, 0, sizeof(F) * (size_t)(m * dp));
      for (int64_t i = lo; i < hi; i += RB) {
        const int rows = (int)MIN(RB, hi - i);
        const F *xrow = x + bi * sxb + i * sxn;
        F *dxrow = dx + bi * sdb + i * sdn;
        const F *gb = g + (bi * n + i) * m, *cb = c ? c + (bi * n + i) * m : NULL;
        for (int64_t k0 = 0; k0 < dfull; k0 += DV * W) {
          const F *xk = xrow + k0, *yk = yb + k0;
          F *dxk = dxrow + k0, *dyk = slot + k0;
          switch ((int)MIN(DV, (dfull - k0) / W)) {
            case 1: (l1 ? FN(gb_1_1_) : FN(gb_1_0_))(xk, sxn, rows, yk, dp, gb, cb, m, scale, dxk, sdn, dyk); break;
#if DV >= 2
            case 2: (l1 ? FN(gb_2_1_) : FN(gb_2_0_))(xk, sxn, rows, yk, dp, gb, cb, m, scale, dxk, sdn, dyk); break;
#endif
#if DV >= 3
            case 3: (l1 ? FN(gb_3_1_) : FN(gb_3_0_))(xk, sxn, rows, yk, dp, gb, cb, m, scale, dxk, sdn, dyk); break;
#endif
#if DV >= 4
            case 4: (l1 ? FN(gb_4_1_) : FN(gb_4_0_))(xk, sxn, rows, yk, dp, gb, cb, m, scale, dxk, sdn, dyk); break;
#endif
            default: break;
          }
        }
        if (dfull < d) { /* the last d % W columns, through zero-padded copies of the x rows */
          F xt[RB * (VBYTES / sizeof(F))], dxt[RB * (VBYTES / sizeof(F))];
          memset(xt, 0, sizeof xt);
          for (int r = 0; r < rows; ++r)
            for (int64_t k = dfull; k < d; ++k) xt[r * W + (k - dfull)] = xrow[r * sxn + k];
          (l1 ? FN(gb_1_1_) : FN(gb_1_0_))(xt, W, rows, yb + dfull, dp, gb, cb, m, scale, dxt, W, slot + dfull);
          for (int r = 0; r < rows; ++r)
            for (int64_t k = dfull; k < d; ++k) dxrow[r * sdn + k] = dxt[r * W + (k - dfull)];
        }
      }
    }
#pragma omp for schedule(static)
    for (int64_t bj = 0; bj < b * m; ++bj) {
      const int64_t bi = bj / m, j = bj % m;
      F *o = dy + bj * d;
      for (int64_t k = 0; k < d; ++k) o[k] = 0;
      for (int64_t ci = 0; ci < chunks; ++ci) {
        const F *p = slots + ((bi * chunks + ci) * m + j) * dp;
        for (int64_t k = 0; k < d; ++k) o[k] -= p[k];
      }
    }
  }
  return 0;
}

#endif
