/* Newton–Schulz loop of the CPU path (DESIGN.md §3): one call solves a batch of G symmetric m x m matrices.
 * Plain C with OpenMP, no Python or torch headers; built at first use by ops/newton_schulz/native.py.
 * Reference (same semantics, to float rounding): naive.newton_schulz_iterate_reference with symmetric=True.
 *
 * p, out: contiguous (G, m, m). Per matrix: alpha = (1 / r^2) * 1.8 with r = max_i sum_j |P_ij|,
 * V0 = alpha P, then `iters` steps of V <- 2V - V (P V). After every `check_every`-th step and after the
 * last one, res = ||I - P V||_F (squares summed in double, rounded to the scalar type like torch's norm);
 * where res <= best (false for NaN) the iterate becomes the best one (best starts at V0 and its residual).
 * With use_tol, the loop of the whole batch stops at the first check where every matrix's best is <= tol:
 * each matrix first runs to its own first such check (or to the end), then those that stopped before the
 * latest one continue to it, so that every matrix takes exactly the steps the batched loop takes.
 * out receives the best iterate of each matrix. Returns 0, or 1 when a workspace allocation failed.
 *
 * Each matrix is computed by one thread, in an order that does not depend on the thread count, so the
 * result does not either. Workspace per matrix: P, V, P V and the next V, m rows of mp (m rounded up to a
 * vector) with zero padding columns (they stay zero: row i of a product only reads columns k < m of A).
 * Products C = A B (or 2A - A B) run in register blocks of up to RB rows x TV vectors of columns; the rows
 * are cut into equal blocks (49 = 4 x 6 + 5 x 5 rows, no 1-row block). When m is a few columns past a
 * multiple of the vector width (m = 49: 3 x 16 + 1 in float32), those columns are dot products of A's rows
 * with B's columns instead of a mostly padded column vector in every block (about 20% of the work at m = 49).
 * Vectors are GCC vector extensions of VBYTES bytes (64 with AVX-512, else 32).
 *
 * The second half of this file is a template: it includes itself (through __FILE__, so it must be
 * compiled by an absolute path) once per scalar type. */
#ifndef LF_T

#define _POSIX_C_SOURCE 200112L /* posix_memalign */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__)
#define VBYTES 64
#else
#define VBYTES 32
#endif
#ifndef RB
#define RB (VBYTES == 64 ? 6 : 3) /* rows per register block */
#endif
#ifndef TV
#define TV 4 /* column vectors per register block */
#endif
#define TAILMAX 4 /* most columns computed as dot products (see lf_ns_geometry) */

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define INLINE static inline __attribute__((always_inline))

static void *lf_ns_alloc(size_t bytes) {
    void *ptr = NULL;
    if (posix_memalign(&ptr, 64, bytes ? bytes : 64) != 0) return NULL;
    return ptr;
}

typedef struct {
    int64_t m, mp;   /* matrix size, row length (m rounded up to a vector) */
    int64_t nvb;     /* column vectors computed in register blocks */
    int64_t tail;    /* last columns computed as dot products (0 .. TAILMAX) */
} lf_ns_geom;

static int lf_ns_thread(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

#define LF_T float
#define LF_S f32
#define LF_I int32_t
#define LF_IMAX INT32_MAX
#include __FILE__
#undef LF_T
#undef LF_S
#undef LF_I
#undef LF_IMAX

#define LF_T double
#define LF_S f64
#define LF_I int64_t
#define LF_IMAX INT64_MAX
#include __FILE__
#undef LF_T
#undef LF_S
#undef LF_I
#undef LF_IMAX

#else /* template body: LF_T the scalar type, LF_S its suffix, LF_I the integer type of its width */

#define FN(name) CAT(CAT(name, _), LF_S)
#define VEC FN(lf_ns_vec)
#define IVEC FN(lf_ns_ivec)
#define DVEC FN(lf_ns_dvec)
#define STATE FN(lf_ns_state)
#define W ((int64_t)(VBYTES / sizeof(LF_T)))

typedef LF_T VEC __attribute__((vector_size(VBYTES)));
typedef LF_I IVEC __attribute__((vector_size(VBYTES)));
typedef double DVEC __attribute__((vector_size(VBYTES / sizeof(LF_T) * sizeof(double))));

typedef struct {
    LF_T *p, *v, *pv, *next; /* m x mp each */
    LF_T *cols;              /* the tail columns of a product's B, transposed: TAILMAX x mp */
    LF_T best;               /* residual of the best iterate (in out) */
    int64_t step;            /* steps done */
} STATE;

/* Rows i0 .. i0+rb, column vectors c0 .. c0+tv of C = A B (sub = 0) or 2A - A B (sub = 1); A, B, C:
 * m x mp, k over the first m columns of A. rb, tv, sub are constants after inlining. */
INLINE void FN(lf_ns_block)(const LF_T *restrict a, const LF_T *restrict b, LF_T *restrict c, int64_t m,
                            int64_t mp, int64_t i0, int64_t c0, const int rb, const int tv, const int sub) {
    VEC acc[RB][TV];
    for (int r = 0; r < rb; r++)
        for (int t = 0; t < tv; t++) acc[r][t] = (VEC){0};
    const LF_T *arow = a + i0 * mp;
    const LF_T *bcol = b + c0 * W;
    for (int64_t k = 0; k < m; k++) {
        VEC bv[TV];
        for (int t = 0; t < tv; t++) bv[t] = *(const VEC *)(bcol + k * mp + t * W);
        for (int r = 0; r < rb; r++) {
            const LF_T x = arow[r * mp + k];
            for (int t = 0; t < tv; t++) acc[r][t] += x * bv[t];
        }
    }
    for (int r = 0; r < rb; r++)
        for (int t = 0; t < tv; t++) {
            VEC *dst = (VEC *)(c + (i0 + r) * mp + (c0 + t) * W);
            if (sub)
                *dst = (LF_T)2 * *(const VEC *)(arow + r * mp + (c0 + t) * W) - acc[r][t];
            else
                *dst = acc[r][t];
        }
}

#define LF_NS_CASE(R, T)                                                   \
    case (R) * 8 + (T):                                                    \
        if (sub)                                                           \
            FN(lf_ns_block)(a, b, c, m, mp, i0, c0, (R), (T), 1);          \
        else                                                               \
            FN(lf_ns_block)(a, b, c, m, mp, i0, c0, (R), (T), 0);          \
        break;
#define LF_NS_ROW(R) LF_NS_CASE(R, 1) LF_NS_CASE(R, 2) LF_NS_CASE(R, 3) LF_NS_CASE(R, 4)

/* The sum of the lanes of x, as a tree (halves added log2 W times). */
INLINE LF_T FN(lf_ns_lanesum)(VEC x) {
    LF_T lanes[VBYTES / sizeof(LF_T)];
    memcpy(lanes, &x, sizeof x);
    for (int h = W / 2; h >= 1; h /= 2)
        for (int l = 0; l < h; l++) lanes[l] += lanes[l + h];
    return lanes[0];
}

/* Columns m - tail .. m of C = A B (or 2A - A B) as dot products of A's rows with B's columns (gathered into
 * cols, zero past m), vectorised over k. */
static void FN(lf_ns_tail)(const LF_T *restrict a, const LF_T *restrict b, LF_T *restrict c, LF_T *restrict cols,
                           const lf_ns_geom *gm, int sub) {
    const int64_t m = gm->m, mp = gm->mp, c0 = m - gm->tail;
    for (int64_t t = 0; t < gm->tail; t++) {
        LF_T *col = cols + t * mp;
        for (int64_t k = 0; k < m; k++) col[k] = b[k * mp + c0 + t];
        for (int64_t k = m; k < mp; k++) col[k] = 0;
    }
    for (int64_t i = 0; i < m; i++) {
        const LF_T *arow = a + i * mp;
        for (int64_t t = 0; t < gm->tail; t++) {
            const LF_T *col = cols + t * mp;
            VEC acc = {0};
            for (int64_t k = 0; k < mp; k += W) acc += *(const VEC *)(arow + k) * *(const VEC *)(col + k);
            const LF_T s = FN(lf_ns_lanesum)(acc);
            c[i * mp + c0 + t] = sub ? (LF_T)2 * arow[c0 + t] - s : s;
        }
    }
}

/* C = A B (sub = 0) or 2A - A B (sub = 1), all m x mp: the first nvb column vectors in register blocks,
 * the last `tail` columns (if any) by lf_ns_tail. */
static void FN(lf_ns_product)(const LF_T *restrict a, const LF_T *restrict b, LF_T *restrict c, LF_T *restrict cols,
                              const lf_ns_geom *gm, int sub) {
    const int64_t m = gm->m, mp = gm->mp, nv = gm->nvb;
    const int64_t blocks = (m + RB - 1) / RB, base = m / blocks, extra = m % blocks;
    for (int64_t c0 = 0; c0 < nv; c0 += TV) {
        const int tv = (int)(nv - c0 < TV ? nv - c0 : TV);
        int64_t i0 = 0;
        for (int64_t blk = 0; blk < blocks; blk++) {
            const int rb = (int)(base + (blk < extra));
            switch (rb * 8 + tv) {
                LF_NS_ROW(1)
                LF_NS_ROW(2)
                LF_NS_ROW(3)
#if RB > 3
                LF_NS_ROW(4)
                LF_NS_ROW(5)
                LF_NS_ROW(6)
#endif
#if RB > 6
                LF_NS_ROW(7)
                LF_NS_ROW(8)
#endif
                default:
                    break;
            }
            i0 += rb;
        }
    }
    if (gm->tail) FN(lf_ns_tail)(a, b, c, cols, gm, sub);
}

/* The geometry of an m x m solve: rows of mp = m rounded up to W; the last m mod W columns by dot products
 * when that costs fewer vector operations (tail (m/W + 4), counting a lane sum as 4) than one more column
 * vector of register blocks (m), else padded register blocks up to mp. */
static lf_ns_geom FN(lf_ns_geometry)(int64_t m) {
    lf_ns_geom gm;
    gm.m = m;
    gm.mp = (m + W - 1) / W * W;
    const int64_t rem = m % W;
    if (rem != 0 && rem <= TAILMAX && rem * (gm.mp / W + 4) < m) {
        gm.tail = rem;
        gm.nvb = m / W;
    } else {
        gm.tail = 0;
        gm.nvb = gm.mp / W;
    }
    return gm;
}

/* ||I - PV||_F over the m x m part (the padding columns are zero): I - PV in the scalar type, squares
 * summed in double, lane j mod W, then the lanes. */
static const LF_T FN(lf_ns_unit)[2 * VBYTES / sizeof(LF_T)] = {[VBYTES / sizeof(LF_T)] = 1};

static LF_T FN(lf_ns_residual)(const LF_T *restrict pv, int64_t m, int64_t mp) {
    DVEC acc = {0};
    for (int64_t i = 0; i < m; i++) {
        const LF_T *row = pv + i * mp;
        for (int64_t j = 0; j < mp; j += W) {
            VEC d = -*(const VEC *)(row + j);
            if (i >= j && i < j + W) { /* 1 - PV_ii, as in (I - PV) */
                VEC e;
                memcpy(&e, FN(lf_ns_unit) + W - (i - j), sizeof e);
                d = e - *(const VEC *)(row + j);
            }
            const DVEC dd = __builtin_convertvector(d, DVEC);
            acc += dd * dd;
        }
    }
    double s = 0.0;
    for (int64_t l = 0; l < W; l++) s += acc[l];
    return (LF_T)sqrt(s);
}

static void FN(lf_ns_keep)(const LF_T *v, LF_T *out, int64_t m, int64_t mp) {
    for (int64_t i = 0; i < m; i++) memcpy(out + i * m, v + i * mp, (size_t)m * sizeof(LF_T));
}

/* P padded, V0 = alpha P, P V0, best = V0. */
static void FN(lf_ns_init)(STATE *st, const LF_T *p, LF_T *out, const lf_ns_geom *gm) {
    const int64_t m = gm->m, mp = gm->mp;
    memset(st->p, 0, (size_t)(4 * m * mp) * sizeof(LF_T)); /* p, v, pv, next */
    for (int64_t i = 0; i < m; i++) memcpy(st->p + i * mp, p + i * m, (size_t)m * sizeof(LF_T));
    LF_T row = 0; /* max_i sum_j |P_ij|, NaN propagating like torch.amax */
    for (int64_t i = 0; i < m; i++) {
        const LF_T *pr = st->p + i * mp;
        VEC acc = {0};
        for (int64_t j = 0; j < mp; j += W) acc += (VEC)(*(const IVEC *)(pr + j) & ((IVEC){0} + LF_IMAX)); /* |P| */
        LF_T s = 0;
        for (int64_t l = 0; l < W; l++) s += acc[l];
        if (s != s || (row == row && s > row)) row = s;
    }
    const LF_T alpha = ((LF_T)1 / (row * row)) * (LF_T)1.8;
    for (int64_t i = 0; i < m; i++)
        for (int64_t j = 0; j < m; j++) st->v[i * mp + j] = alpha * st->p[i * mp + j];
    FN(lf_ns_product)(st->p, st->v, st->pv, st->cols, gm, 0);
    st->best = FN(lf_ns_residual)(st->pv, m, mp);
    FN(lf_ns_keep)(st->v, out, m, mp);
    st->step = 0;
}

/* Steps until `until`; with stop_at_tol, returns after the first check where best <= tol. */
static void FN(lf_ns_advance)(STATE *st, LF_T *out, const lf_ns_geom *gm, int64_t iters, int64_t until,
                              int64_t check_every, LF_T tol, int stop_at_tol) {
    const int64_t m = gm->m, mp = gm->mp;
    while (st->step < until) {
        FN(lf_ns_product)(st->v, st->pv, st->next, st->cols, gm, 1);
        LF_T *t = st->v;
        st->v = st->next;
        st->next = t;
        FN(lf_ns_product)(st->p, st->v, st->pv, st->cols, gm, 0);
        st->step++;
        if (st->step % check_every != 0 && st->step < iters) continue;
        const LF_T res = FN(lf_ns_residual)(st->pv, m, mp);
        if (res <= st->best) {
            st->best = res;
            FN(lf_ns_keep)(st->v, out, m, mp);
        }
        if (stop_at_tol && st->best <= tol) return;
    }
}

int FN(lf_ns)(const LF_T *p, LF_T *out, int64_t g, int64_t m, int64_t iters, int64_t check_every, LF_T tol,
              int use_tol, int threads) {
    if (g <= 0 || m <= 0) return 0;
    if (check_every < 1) check_every = 1;
    if (iters < 0) iters = 0;
    if (threads < 1) threads = 1;
    if (threads > g) threads = (int)g;
    const lf_ns_geom gm = FN(lf_ns_geometry)(m);
    const int64_t mat = m * gm.mp, slab_size = 4 * mat + TAILMAX * gm.mp;
    /* With tol every matrix keeps its state for the second pass; else one workspace per thread. */
    const int64_t slabs = use_tol ? g : threads;
    LF_T *ws = (LF_T *)lf_ns_alloc((size_t)(slabs * slab_size) * sizeof(LF_T));
    STATE *states = (STATE *)malloc((size_t)(use_tol ? g : 1) * sizeof(STATE));
    if (ws == NULL || states == NULL) {
        free(ws);
        free(states);
        return 1;
    }
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
    for (int64_t i = 0; i < g; i++) {
        STATE local, *st = use_tol ? &states[i] : &local;
        LF_T *slab = ws + (use_tol ? i : lf_ns_thread()) * slab_size;
        st->p = slab;
        st->v = slab + mat;
        st->pv = slab + 2 * mat;
        st->next = slab + 3 * mat;
        st->cols = slab + 4 * mat;
        FN(lf_ns_init)(st, p + i * m * m, out + i * m * m, &gm);
        FN(lf_ns_advance)(st, out + i * m * m, &gm, iters, iters, check_every, tol, use_tol);
    }
    if (use_tol) {
        int64_t until = 0;
        for (int64_t i = 0; i < g; i++)
            if (states[i].step > until) until = states[i].step;
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads) if (threads > 1)
        for (int64_t i = 0; i < g; i++)
            if (states[i].step < until)
                FN(lf_ns_advance)(&states[i], out + i * m * m, &gm, iters, until, check_every, tol, 0);
    }
    free(ws);
    free(states);
    return 0;
}

#undef FN
#undef VEC
#undef IVEC
#undef DVEC
#undef STATE
#undef W
#endif
