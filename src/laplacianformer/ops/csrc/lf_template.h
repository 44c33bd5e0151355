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

#include <stdint.h>
#include <stdlib.h>

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

/* A buffer of `bytes` bytes aligned to 64; *base is what to free. */
static void *lf_alloc(size_t bytes, void **base) {
  *base = malloc(bytes + 64);
  return *base ? (void *)(((uintptr_t)*base + 63) & ~(uintptr_t)63) : NULL;
}

#endif
