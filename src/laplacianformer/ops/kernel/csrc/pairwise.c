/* Pairwise-distance loops of the CPU path (SPEC.md §1, §6); formulas in ops/kernel/cpu.py.
 * Plain C with OpenMP, no Python or torch headers, so it builds in about a second at first use.
 * x: (B, N, d), y: (B, M, d), yt: y transposed per batch to (B, d, M), g, c: (B, N, M); all contiguous.
 * dist_*: scale * D (B, N, M), D the L1 (l1 != 0) or squared-L2 distance.
 * grad_*: with dL/dD = g * c * scale (c may be NULL: dL/dD = g * scale), dX (B, N, d) and dY parts
 * (B, chunks, M, d): each row chunk sums into its own slot and the caller adds the slots, so the result
 * does not depend on the thread count. sign(0) = 0.
 * The forward is vectorised over m (y transposed); the backward over d, with two rows of x per pass
 * (RB) so each load of a y row and each update of a dY row serves both. */
#include <stdint.h>
#include <string.h>

#define RB 2

#define ABS(t) ((t) < 0 ? -(t) : (t))
#define SIGN(T, t) ((T)(((t) > 0) - ((t) < 0)))

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
          for (int64_t j = 0; j < m; ++j) acc[j] += ABS(xv - yk[j]);                           \
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
  static inline void NAME##_rows(const T *restrict x, const T *restrict y, const T *restrict g,  \
                                 const T *restrict c, T *restrict dx, T *restrict dy,            \
                                 int64_t rows, int64_t m, int64_t d, T scale, int l1) {          \
    memset(dx, 0, sizeof(T) * rows * d);                                                         \
    const T *x1 = rows > 1 ? x + d : x;                                                          \
    T *dx1 = dx + (rows > 1 ? d : 0);                                                            \
    for (int64_t j = 0; j < m; ++j) {                                                            \
      const T g0 = (c ? g[j] * c[j] : g[j]) * scale;                                             \
      const T g1 = rows > 1 ? (c ? g[m + j] * c[m + j] : g[m + j]) * scale : 0;                  \
      const T *yj = y + j * d;                                                                   \
      T *dyj = dy + j * d;                                                                       \
      if (l1) {                                                                                  \
        for (int64_t k = 0; k < d; ++k) {                                                        \
          const T t0 = x[k] - yj[k], t1 = x1[k] - yj[k];                                         \
          const T s0 = SIGN(T, t0) * g0, s1 = SIGN(T, t1) * g1;                                  \
          dx[k] += s0;                                                                           \
          dx1[k] += s1;                                                                          \
          dyj[k] -= s0 + s1;                                                                     \
        }                                                                                        \
      } else {                                                                                   \
        for (int64_t k = 0; k < d; ++k) {                                                        \
          const T s0 = 2 * (x[k] - yj[k]) * g0, s1 = 2 * (x1[k] - yj[k]) * g1;                   \
          dx[k] += s0;                                                                           \
          dx1[k] += s1;                                                                          \
          dyj[k] -= s0 + s1;                                                                     \
        }                                                                                        \
      }                                                                                          \
    }                                                                                            \
  }                                                                                              \
  void NAME(const T *x, const T *y, const T *g, const T *c, T *dx, T *dy_parts, int64_t b,       \
            int64_t n, int64_t m, int64_t d, int64_t chunks, T scale, int l1, int threads) {     \
    const int64_t rows = (n + chunks - 1) / chunks;                                              \
    _Pragma("omp parallel for schedule(dynamic) num_threads(threads)")                          \
    for (int64_t t = 0; t < b * chunks; ++t) {                                                   \
      const int64_t bi = t / chunks, ci = t % chunks;                                            \
      T *dyacc = dy_parts + t * m * d;                                                           \
      memset(dyacc, 0, sizeof(T) * m * d);                                                       \
      const int64_t lo = ci * rows;                                                              \
      const int64_t hi = lo + rows < n ? lo + rows : n;                                          \
      for (int64_t i = lo; i < hi; i += RB) {                                                    \
        const int64_t r = bi * n + i;                                                            \
        const int64_t cnt = hi - i < RB ? hi - i : RB;                                           \
        NAME##_rows(x + r * d, y + bi * m * d, g + r * m, c ? c + r * m : 0, dx + r * d, dyacc, \
                    cnt, m, d, scale, l1);                                                       \
      }                                                                                          \
    }                                                                                            \
  }

DEFINE_DIST(lf_dist_f32, float)
DEFINE_DIST(lf_dist_f64, double)
DEFINE_GRAD(lf_grad_f32, float)
DEFINE_GRAD(lf_grad_f64, double)
