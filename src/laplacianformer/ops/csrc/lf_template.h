/* What the C sources of the CPU paths share (DESIGN.md §6): ops/csrc/normalization.c, ops/csrc/grid.c and
 * ops/kernel/csrc/pairwise.c include it once, after the system headers and before their template, the
 * second half of the file, which is compiled once per scalar type with LF_T (the type) and LF_SFX (its name
 * suffix, f32 / f64) set: the sources beside this header through lf_instances.h, pairwise.c by including
 * itself through __FILE__ (it also sets LF_I, the integer of the same width). ops/_clib.py keys a source's build by the
 * headers it includes as well.
 *
 * The names of a template body are defined here once, for every instantiation: a macro expands where it
 * is used, so each one sees its own LF_T and LF_SFX. A source defines W (its vector lanes, of the integer
 * type it indexes with) next to them. */
#ifndef LF_TEMPLATE_H
#define LF_TEMPLATE_H

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>

#ifndef VBYTES /* bytes per vector: the machine's widest (a source may set its own first) */
#if defined(__AVX512F__)
#define VBYTES 64
#else
#define VBYTES 32
#endif
#endif

#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define INLINE static inline __attribute__((always_inline))
#define MIN(a, b) ((a) < (b) ? (a) : (b))
#define MAX(a, b) ((a) > (b) ? (a) : (b))

#define F LF_T                   /* the scalar type */
#define FN(name) CAT(name, LF_SFX) /* a name of the template, one per scalar type */
#define V FN(vec_)               /* VBYTES bytes of F, aligned to VBYTES */
#define VU FN(uvec_)             /* the same, aligned to F only: unaligned loads and stores */
/* The typedefs of V and VU, at the start of a template body (VBYTES set by the source). */
#define LF_VECTOR_TYPES                            \
  typedef F V __attribute__((vector_size(VBYTES))); \
  typedef F VU __attribute__((vector_size(VBYTES), aligned(sizeof(F))));

/* A workspace of `bytes` bytes aligned to 64, owned by the calling thread and kept for its next call: it
 * grows to the largest size asked for and is freed when the thread exits, never by the caller. A pass's
 * workspace is then not allocated, faulted in page by page and given back on every call (with glibc's
 * default settings a freed top of the heap returns to the kernel: one minor fault per 4 KiB on the next
 * call; docs/DESIGN.md §6.6). NULL when it cannot grow. One per source (built as its own library) and
 * thread: a pass holds it until it returns and calls no other pass of its source meanwhile. Only the
 * calling thread asks for it, before its parallel region; the OpenMP threads work in slices of it. */
typedef struct {
  void *base;
  size_t cap;
} lf_scratch_t;
static pthread_key_t lf_scratch_key;
static pthread_once_t lf_scratch_once = PTHREAD_ONCE_INIT;
static int lf_scratch_ok;
static void lf_scratch_free(void *p) {
  lf_scratch_t *s = (lf_scratch_t *)p;
  free(s->base);
  free(s);
}
static void lf_scratch_init(void) { lf_scratch_ok = pthread_key_create(&lf_scratch_key, lf_scratch_free) == 0; }
static void *lf_scratch(size_t bytes) {
  pthread_once(&lf_scratch_once, lf_scratch_init);
  if (!lf_scratch_ok) return NULL;
  lf_scratch_t *s = (lf_scratch_t *)pthread_getspecific(lf_scratch_key);
  if (!s) {
    if (!(s = (lf_scratch_t *)calloc(1, sizeof *s))) return NULL;
    if (pthread_setspecific(lf_scratch_key, s)) {
      free(s);
      return NULL;
    }
  }
  if (bytes > s->cap) {
    free(s->base);
    s->cap = 0;
    if (!(s->base = malloc(bytes + 64))) return NULL;
    s->cap = bytes;
  }
  return (void *)(((uintptr_t)s->base + 63) & ~(uintptr_t)63);
}

#endif
