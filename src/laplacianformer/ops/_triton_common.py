"""``@triton.jit`` building blocks shared by the Triton kernels (docs/DESIGN.md §6): the precision choice of
a product, and masked loads and stores of a block of a row-major matrix.

- ``dot``: a float32 product, IEEE (``IEEE``) or the default (TF32 on GPUs that have it).
- ``load_block`` / ``store_block``: rows ``rows`` (< R) and columns c0 .. c0 + BLOCK_C (< C) of the
  row-major (R, C) matrix at P; out-of-range elements read as 0 and are not written. Loads come back in
  float32, stores convert to P's element type.
- ``distinct_launches``: the ahead-of-time list of a module's launch configurations (benchmarks/triton_aot.py),
  each distinct one once (plain Python).
- ``product_from_memory``: A @ B in IEEE float32 with both operands read from memory in k-chunks, so no whole
  (m, m) operand is held in registers (the m×m algebra of the streaming combine and backward kernels).

Gated (triton at module level), imported only by the Triton modules.
"""

from __future__ import annotations

import triton
import triton.language as tl

LAUNCH_OPTIONS = ("num_warps", "num_stages", "maxnreg")


def distinct_launches(launches, signature):
    """The AOT tuples (kernel, signature, constexprs, num_warps, num_stages, label, {"maxnreg": ...}) of
    ``launches``, an iterable of (kernel, spec, label) with spec the constexprs plus ``LAUNCH_OPTIONS``: each
    distinct (kernel, constexprs, options) once, under the label of its first launch. ``signature(kernel,
    constexprs)`` maps the runtime arguments to Triton types."""
    seen = set()
    for kernel, spec, label in launches:
        opts = {k: spec[k] for k in LAUNCH_OPTIONS}
        meta = {k: v for k, v in spec.items() if k not in opts}
        key = (kernel.__name__, tuple(sorted((k, str(v)) for k, v in meta.items())), tuple(sorted(opts.items())))
        if key not in seen:
            seen.add(key)
            yield (kernel, signature(kernel, meta), meta, opts["num_warps"], opts["num_stages"], label,
                   {"maxnreg": opts["maxnreg"]})


def power_of_two_sizes(top: int, cap: int) -> list[int]:
    """16, 32, 64, 128 up to the next power of two of min(top, cap): the sizes an AOT list enumerates for a
    dimension the specs see only through ``next_power_of_2``."""
    bound = max(16, triton.next_power_of_2(min(top, cap)))
    return [x for x in (16, 32, 64, 128) if x <= bound]


@triton.jit
def dot(a, b, IEEE: tl.constexpr):
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def load_block(P, rows, R, C, c0, BLOCK_C: tl.constexpr):
    """The block in float32 (0 outside the matrix)."""
    cols = c0 + tl.arange(0, BLOCK_C)
    return tl.load(P + rows[:, None] * C + cols[None, :], mask=(rows[:, None] < R) & (cols[None, :] < C),
                   other=0.0).to(tl.float32)


@triton.jit
def store_block(P, x, rows, R, C, c0, BLOCK_C: tl.constexpr):
    """Writes ``x`` (len(rows), BLOCK_C) into the block, converted to P's element type."""
    cols = c0 + tl.arange(0, BLOCK_C)
    tl.store(P + rows[:, None] * C + cols[None, :], x.to(P.dtype.element_ty),
             mask=(rows[:, None] < R) & (cols[None, :] < C))


@triton.jit
def product_from_memory(A, sa_r, sa_c, B, sb_r, sb_c, R, K, C, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr,
                        BLOCK_K: tl.constexpr):
    """A @ B as a (BLOCK_R, BLOCK_C) tile, IEEE float32: A (R, K) and B (K, C) at the given (row, column)
    strides (a transpose is a swap of strides), k in chunks of BLOCK_K read from memory (``.cg``: an operand
    may be this program's scratch, written before a CTA barrier); 0 outside (R, C)."""
    ri = tl.arange(0, BLOCK_R)
    rc = tl.arange(0, BLOCK_C)
    acc = tl.zeros((BLOCK_R, BLOCK_C), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        rk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(A + ri[:, None] * sa_r + rk[None, :] * sa_c, mask=(ri[:, None] < R) & (rk[None, :] < K),
                    other=0.0, cache_modifier=".cg")
        b = tl.load(B + rk[:, None] * sb_r + rc[None, :] * sb_c, mask=(rk[:, None] < K) & (rc[None, :] < C),
                    other=0.0, cache_modifier=".cg")
        acc = tl.dot(a, b, acc, input_precision="ieee")
    return acc
