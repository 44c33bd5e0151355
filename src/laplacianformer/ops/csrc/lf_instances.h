/* The two instances of a C source's template (lf_template.h): the source, in ops/csrc/ beside this header,
 * defines LF_SELF as its own file name and includes this header at the end of its first half; the header
 * includes the source again with LF_T / LF_SFX set to float / f32, then to double / f64, which compiles the
 * source's second half (its `#else` branch of `#ifndef LF_T`) once per scalar type. */
#define LF_T float
#define LF_SFX f32
#include LF_SELF
#undef LF_T
#undef LF_SFX

#define LF_T double
#define LF_SFX f64
#include LF_SELF
#undef LF_T
#undef LF_SFX
