"""``@triton.jit`` building blocks shared by the Triton kernels (docs/DESIGN.md §6): the precision choice of
a product, and masked loads and stores of a block of a row-major matrix.

- ``dot``: a float32 product, IEEE (``IEEE``) or the default (TF32 on GPUs that have it).
- ``load_block`` / ``store_block``: rows ``rows`` (< R) and columns c0 .. c0 + BLOCK_C (< C) of the
  row-major (R, C) matrix at P; out-of-range elements read as 0 and are not written. Loads come back in
  float32, stores convert to P's element type.

Gated (triton at module level), imported only by the Triton modules.
"""

from __future__ import annotations

import triton
import triton.language as tl


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
