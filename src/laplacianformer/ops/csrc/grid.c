/* The token-grid steps of CPU inference around the Nyström core (DESIGN.md §2.1, §4.5, §6.6): landmark pooling
 * and DWConv(V) with the heads merged into it. The calling code is ops/grid_cpu.py; plain C with OpenMP, no
 * Python or torch headers, built at first use like the other CPU sources (ops/_clib.py).
 *
 * lf_pool: adaptive average pooling of a (gh, gw) token grid to (lh, lw) bins, per (batch, head):
 *   x (B, H, gh·gw, d) with element strides (sb, sh, sn, 1) -> out (B, H, lh·lw, d) contiguous;
 *   bin (i, j) averages rows floor(i·gh/lh) .. ceil((i+1)·gh/lh) − 1 and the same of the columns (the bins of
 *   F.adaptive_avg_pool2d; a 1-D sequence is the (1, N) grid).
 * lf_dwconv_merge: out (B, N, C) contiguous = DWConv3x3(V) + bias + the heads merged, per token:
 *   out[b, n, c] = bias[c] + Σ_taps w[t][c] · V[b, n + tap, c] + heads[b, c / e, n, c mod e],
 *   V (B, N, C) with strides (svb, svn, 1) read as the (gh, gw) grid with zero padding, w (9, C) the taps in
 *   row-major (ky, kx) order, bias (C) or NULL, heads (B, H, N, e) with strides (shb, shh, shn, 1), C = H·e.
 *   A 1-D sequence is the (1, N) grid: its top and bottom taps meet the padding only (kernel 3 along N).
 * Each output element is written by one thread in a fixed order: results do not depend on the thread count.
 * The conv sums of CB vectors of channels stay in registers over the 9 taps; the heads are added after.
 *
 * The second half of this file is a template, compiled once per scalar type through lf_instances.h. */
#ifndef LF_T

#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifndef CB
#define CB 4 /* vectors of channels whose conv sums stay in registers over the 9 taps */
#endif

#include "lf_template.h"
#define W ((int64_t)(VBYTES / sizeof(F)))

static int64_t lfg_lo(int64_t i, int64_t n, int64_t out) { return i * n / out; }
static int64_t lfg_hi(int64_t i, int64_t n, int64_t out) { return ((i + 1) * n + out - 1) / out; }

#define LF_SELF "grid.c"
#include "lf_instances.h"

#else /* the template: F, FN() from lf_template.h */

int FN(lf_pool_)(const F *x, int64_t b, int64_t h, int64_t sb, int64_t sh, int64_t sn, int64_t gh, int64_t gw,
                 int64_t lh, int64_t lw, int64_t d, F *out, int threads) {
  F *scratch = (F *)lf_scratch(sizeof(F) * (size_t)(threads * lw * d + 1));
  if (!scratch) return 1;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < b * h * lh; ++task) {
    const int64_t bi = task / (h * lh), hi = task / lh % h, i = task % lh;
    const F *xg = x + bi * sb + hi * sh;
    F *acc = scratch + (int64_t)omp_get_thread_num() * lw * d;
    memset(acc, 0, sizeof(F) * (size_t)(lw * d));
    const int64_t y0 = lfg_lo(i, gh, lh), y1 = lfg_hi(i, gh, lh);
    for (int64_t y = y0; y < y1; ++y)
      for (int64_t j = 0; j < lw; ++j) {
        F *restrict a = acc + j * d;
        for (int64_t xc = lfg_lo(j, gw, lw); xc < lfg_hi(j, gw, lw); ++xc) {
          const F *restrict row = xg + (y * gw + xc) * sn;
#pragma omp simd
          for (int64_t k = 0; k < d; ++k) a[k] += row[k];
        }
      }
    F *o = out + ((bi * h + hi) * lh + i) * lw * d;
    for (int64_t j = 0; j < lw; ++j) {
      const F inv = (F)1 / (F)((y1 - y0) * (lfg_hi(j, gw, lw) - lfg_lo(j, gw, lw)));
      for (int64_t k = 0; k < d; ++k) o[j * d + k] = acc[j * d + k] * inv;
    }
  }
  return 0;
}

LF_VECTOR_TYPES

/* o[k0 + :NV·W] = bias + Σ_taps w[t][k] · V[tap][k] for one token, the NV vectors of sums in registers over the
 * taps (the same order of operations as one channel at a time). vr[t] (t < 9): the tap's row of V or NULL
 * (padding). */
INLINE void FN(dw_block_)(const F *const vr[9], const F *restrict w, const F *restrict bias, int64_t c, int64_t k0,
                          F *restrict o, const int NV) {
  V acc[CB];
  for (int t = 0; t < NV; ++t) acc[t] = bias ? *(const VU *)(bias + k0 + t * W) : (V){0};
  for (int tap = 0; tap < 9; ++tap) {
    if (!vr[tap]) continue;
    for (int t = 0; t < NV; ++t)
      acc[t] += *(const VU *)(w + tap * c + k0 + t * W) * *(const VU *)(vr[tap] + k0 + t * W);
  }
  for (int t = 0; t < NV; ++t) *(VU *)(o + k0 + t * W) = acc[t];
}

int FN(lf_dwconv_merge_)(const F *v, int64_t b, int64_t gh, int64_t gw, int64_t c, int64_t svb, int64_t svn,
                         const F *w, const F *bias, const F *heads, int64_t h, int64_t e, int64_t shb, int64_t shh,
                         int64_t shn, F *out, int threads) {
  const int64_t n = gh * gw;
#pragma omp parallel for num_threads(threads) schedule(static)
  for (int64_t task = 0; task < b * gh; ++task) {
    const int64_t bi = task / gh, y = task % gh;
    const F *vb = v + bi * svb;
    for (int64_t x = 0; x < gw; ++x) {
      const int64_t tok = y * gw + x;
      F *restrict o = out + (bi * n + tok) * c;
      const F *vr[9];
      for (int64_t ky = 0; ky < 3; ++ky)
        for (int64_t kx = 0; kx < 3; ++kx) {
          const int64_t yy = y + ky - 1, xx = x + kx - 1;
          vr[ky * 3 + kx] = yy < 0 || yy >= gh || xx < 0 || xx >= gw ? NULL : vb + (yy * gw + xx) * svn;
        }
      int64_t k0 = 0;
      for (; k0 + CB * W <= c; k0 += CB * W) FN(dw_block_)(vr, w, bias, c, k0, o, CB);
      for (; k0 + W <= c; k0 += W) FN(dw_block_)(vr, w, bias, c, k0, o, 1);
      for (int64_t k = k0; k < c; ++k) {
        F a = bias ? bias[k] : (F)0;
        for (int tap = 0; tap < 9; ++tap)
          if (vr[tap]) a += w[tap * c + k] * vr[tap][k];
        o[k] = a;
      }
      for (int64_t hh = 0; hh < h; ++hh) {
        const F *restrict hr = heads + bi * shb + hh * shh + tok * shn;
        F *restrict oh = o + hh * e;
#pragma omp simd
        for (int64_t k = 0; k < e; ++k) oh[k] += hr[k];
      }
    }
  }
  return 0;
}

#endif
