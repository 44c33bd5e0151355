/* Pairwise-distance loops of the CPU path (SPEC.md §1, §6); formulas in ops/kernel/cpu.py.
 * Plain C with OpenMP, no Python or torch headers, so it builds in about a second at first use.
 * x: (B, N, d), y: (B, M, d), yt: y transposed per batch to (B, d, M), gp: (B, N, M) = dL/dD; all contiguous.
 * dist_*: scale * D (B, N, M), D the L1 (l1 != 0) or squared-L2 distance.
 * grad_*: with gp = g * c * scale (g, c: (B, N, M); c may be NULL, then gp = g * scale), dX (B, N, d)
 * and dY parts (B, chunks, M, d): each row chunk sums into its own slot, the caller adds the slots, so
 * the result does not depend on the thread count. sign(0) = 0. */
#include <stdint.h>
#include <string.h>

#define DEFINE_DIST(NAME, T)                                                                     \
  void NAME(const T *x, const T *yt, T *out, int64_t b, int64_t n, int64_t m, int64_t d,       \
            T scale, int l1, int threads) {                                                      \
    _Pragma("omp parallel for schedule(static) num_threads(threads)")                           \
    for (int64_t r = 0; r < b * n; ++r) {                                                        \
      const T *xr = x + r * d;                                                                   \
      const T *ytb = yt + (r / n) * d * m;                                                       \
      T *acc = out + r * m;                                                                      \
      for (int64_t j = 0; j < m; ++j) acc[j] = 0;                                                \
      for (int64_t k = 0; k < d; ++k) {                                                          \
        const T xv = xr[k];                                                                      \
        const T *yk = ytb + k * m;                                                               \
        if (l1) {                                                                                \
          for (int64_t j = 0; j < m; ++j) acc[j] += xv > yk[j] ? xv - yk[j] : yk[j] - xv;                          \
        } else {                                                                                 \
          for (int64_t j = 0; j < m; ++j) {                                                      \
            const T t = xv - yk[j];                                                              \
            acc[j] += t * t;                                                                     \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
      for (int64_t j = 0; j < m; ++j) acc[j] *= scale;                                           \
    }                                                                                            \
  }

#define DEFINE_GRAD(NAME, T)                                                                     \
  void NAME(const T *x, const T *y, const T *g, const T *c, T *dx, T *dy_parts, int64_t b,       \
            int64_t n, int64_t m, int64_t d, int64_t chunks, T scale, int l1, int threads) {     \
    const int64_t rows = (n + chunks - 1) / chunks;                                              \
    _Pragma("omp parallel for schedule(dynamic) num_threads(threads)")                          \
    for (int64_t t = 0; t < b * chunks; ++t) {                                                   \
      const int64_t bi = t / chunks, ci = t % chunks;                                            \
      T *dyacc = dy_parts + t * m * d;                                                           \
      const T *yb = y + bi * m * d;                                                              \
      memset(dyacc, 0, sizeof(T) * m * d);                                                       \
      const int64_t lo = ci * rows;                                                              \
      const int64_t hi = lo + rows < n ? lo + rows : n;                                          \
      for (int64_t i = lo; i < hi; ++i) {                                                        \
        const int64_t r = bi * n + i;                                                            \
        const T *xr = x + r * d;                                                                 \
        const T *gr = g + r * m;                                                                 \
        const T *cr = c ? c + r * m : 0;                                                         \
        T *dxr = dx + r * d;                                                                     \
        for (int64_t k = 0; k < d; ++k) dxr[k] = 0;                                              \
        for (int64_t j = 0; j < m; ++j) {                                                        \
          const T gj = (cr ? gr[j] * cr[j] : gr[j]) * scale;                                     \
          const T *yj = yb + j * d;                                                              \
          T *dyj = dyacc + j * d;                                                                \
          if (l1) {                                                                              \
            for (int64_t k = 0; k < d; ++k) {                                                    \
              const T diff = xr[k] - yj[k];                                                      \
              const T s = (T)((diff > 0) - (diff < 0)) * gj;                                     \
              dxr[k] += s;                                                                       \
              dyj[k] -= s;                                                                       \
            }                                                                                    \
          } else {                                                                               \
            for (int64_t k = 0; k < d; ++k) {                                                    \
              const T s = 2 * (xr[k] - yj[k]) * gj;                                               \
              dxr[k] += s;                                                                       \
              dyj[k] -= s;                                                                       \
            }                                                                                    \
          }                                                                                      \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }

DEFINE_DIST(lf_dist_f32, float)
DEFINE_DIST(lf_dist_f64, double)
DEFINE_GRAD(lf_grad_f32, float)
DEFINE_GRAD(lf_grad_f64, double)
