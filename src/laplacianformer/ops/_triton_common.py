"""``@triton.jit`` building blocks shared by the Triton kernels (docs/DESIGN.md §6): the kernel families'
profile, the precision choice of a product, and masked loads and stores of a block of a row-major matrix.

- The kernel families (docs/DESIGN.md §1.5, ``kernel_families``): every kernel takes the family's id as the
  constexpr ``KID``; ``sums_abs(KID)`` says what its distance loops accumulate (|x − y| or (x − y)²),
  ``kernel_value(acc, scale, KID)`` is k = f(r / λ) from the accumulated distance and ``kernel_slope(acc, k, scale,
  KID)`` dk/d(acc) (``kernel_chain``: dL/d(acc) from dL/dk), scale = −1 / λ the kernels' runtime argument, distance
  and f as ``PROFILES`` says for the id. The Laplacian and the Gaussian (f = exp on the accumulation itself) keep
  the code of before: exp(scale · acc) and the slope scale · k.

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

import math

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


PROFILES = {0: ("l1", "exp"), 1: ("sq_l2", "exp"), 2: ("l2", "exp"), 3: ("l2", "linear_exp"),
            4: ("sq_l2", "reciprocal")}
"""The Triton profile: kernel family id (``KernelSpec.id``) -> (its distance r, the form of f), k = f(r / λ) with
"exp" f(u) = exp(−u), "linear_exp" (1 + √3 u) exp(−√3 u), "reciprocal" 1 / (1 + u) (docs/KERNELS.md, "Kernel
families"; forms are named by their shape, never by a family: the families are the registry's).
Its ids are ``kernel.limits.TRITON_KERNEL_IDS`` (pure Python, for the registry) and each distance is the
registry's (tests/ops/test_kernel_triton.py holds both). A family with a new id and a known form is one entry
here and in that set; a new form is a branch of ``kernel_value`` and ``kernel_slope``."""
_FROM_VALUE = ("exp", "reciprocal")
"""The forms whose f′(u) is a function of f(u) alone (exp: −f, reciprocal: −f²)."""
_SQRT3 = tl.constexpr(math.sqrt(3.0))


def family_sums_abs(kid: int) -> bool:
    """Whether the distance loops of family id ``kid`` sum |x − y| (the "l1" distance), else (x − y)²."""
    return PROFILES[kid][0] == "l1"


def family_takes_root(kid: int) -> bool:
    """Whether r = √acc (the "l2" distance), else r = acc."""
    return PROFILES[kid][0] == "l2"


def family_form(kid: int) -> str:
    return PROFILES[kid][1]


def family_exp_in_place(kid: int) -> bool:
    """f = exp on r = acc (the Laplacian, the Gaussian): k = exp(scale · acc), dk/d(acc) = scale · k, scale = −1/λ."""
    return PROFILES[kid][1] == "exp" and PROFILES[kid][0] != "l2"


def family_slope_reads_distance(kid: int) -> bool:
    """Whether dk/d(acc) reads the accumulated distance (else k alone gives it): a backward given only C (the
    kernel op's without V, pass C's W) recomputes the distance for these."""
    return PROFILES[kid][0] == "l2" or PROFILES[kid][1] not in _FROM_VALUE


# the same predicates on the constexpr KID, evaluated at compile time (Triton lets them read globals, call nothing)
sums_abs = triton.constexpr_function(family_sums_abs)
slope_reads_distance = triton.constexpr_function(family_slope_reads_distance)
_root = triton.constexpr_function(family_takes_root)
_form = triton.constexpr_function(family_form)
_exp_in_place = triton.constexpr_function(family_exp_in_place)


@triton.jit
def _argument(acc, scale, KID: tl.constexpr):
    """u = r / λ = −scale · r: r = √acc for the "l2" distance, else acc."""
    if _root(KID):
        return tl.sqrt(acc) * -scale
    return acc * -scale


@triton.jit
def kernel_value(acc, scale, KID: tl.constexpr):
    """k = f(r / λ) of family id KID, elementwise, from the accumulated distance ``acc`` (float32, any shape; the
    sum ``sums_abs`` says) and scale = −1 / λ, the kernels' runtime argument (docs/DESIGN.md §1.5): exp(scale · acc),
    the code of before, for the in-place exp ids. Applied after the distance loop, never in it."""
    if _exp_in_place(KID):
        return tl.exp(acc * scale)
    u = _argument(acc, scale, KID)
    if _form(KID) == "exp":
        k = tl.exp(-u)
    elif _form(KID) == "linear_exp":
        s = _SQRT3 * u
        k = (1.0 + s) * tl.exp(-s)
    else:
        tl.static_assert(_form(KID) == "reciprocal", "kernel_value: no Triton profile form for this id")
        k = 1.0 / (1.0 + u)
    return k


@triton.jit
def kernel_slope(acc, k, scale, KID: tl.constexpr):
    """dk/d(acc) for k = ``kernel_value(acc)``, scale = −1 / λ: f′(u) / λ, times 1 / (2r) for the "l2" distance, 0
    there where r = 0 (the minimal-norm subgradient, as ``KernelSpec.slope_of``; docs/DESIGN.md §1.5). f′ from k
    where it is a function of it (exp −k, reciprocal −k²; linear_exp −3u·k / (1 + √3 u)), so that k = 0 (a masked tile
    entry) gives 0."""
    if _exp_in_place(KID):
        return k * scale
    if _form(KID) == "exp":
        df = -k
    elif _form(KID) == "linear_exp":
        u = _argument(acc, scale, KID)
        df = -3.0 * u * k / (1.0 + _SQRT3 * u)
    else:
        tl.static_assert(_form(KID) == "reciprocal", "kernel_slope: no Triton profile form for this id")
        df = -k * k
    slope = df * -scale
    if _root(KID):
        pos = acc > 0.0
        slope = tl.where(pos, slope * (0.5 / tl.sqrt(tl.where(pos, acc, 1.0))), 0.0)
    return slope


@triton.jit
def kernel_chain(dk, k, acc, scale, KID: tl.constexpr, SCALE_FIRST: tl.constexpr):
    """dL/d(acc) = dk · dk/d(acc) from dk = dL/dk, k and the accumulated distance (read only where
    ``slope_reads_distance``), scale = −1 / λ. For the in-place exp ids the product of before, bit for bit:
    (dk · k) · scale, or with ``SCALE_FIRST`` (scale · dk) · k (the order the row pass D had)."""
    if _exp_in_place(KID):
        if SCALE_FIRST:
            return scale * dk * k
        return dk * k * scale
    return dk * kernel_slope(acc, k, scale, KID)


@triton.jit
def kernel_factor(acc, k, scale, KID: tl.constexpr):
    """What ``factor_chain`` needs of a tile besides dL/dk, formed as soon as the tile is: dk/d(acc) for a family
    whose slope reads the distance (the distance then dies with the tile: one (rows × landmarks) tile held, not
    two), else k itself (the same tensor: nothing more held)."""
    if slope_reads_distance(KID):
        return kernel_slope(acc, k, scale, KID)
    return k


@triton.jit
def factor_chain(dk, factor, scale, KID: tl.constexpr, SCALE_FIRST: tl.constexpr):
    """``kernel_chain`` from ``kernel_factor``'s value: dk · slope, or the chain on k."""
    if slope_reads_distance(KID):
        return dk * factor
    return kernel_chain(dk, factor, factor, scale, KID, SCALE_FIRST)


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
