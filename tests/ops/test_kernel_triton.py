"""Fused Triton kernels (ops/kernel/triton.py) against the naive reference: values and every gradient.

Every kernel family the Triton profile has: the full matrix for the Laplacian and the Gaussian, a case per op for
the others (``PROFILE_FAMILIES``, with pairs at distance 0), and the profile itself (``_triton_common.kernel_value``,
``kernel_slope``, ``kernel_chain``) against the registry's ``kernel_of`` / ``slope_of`` for every id. Runs for real on
CUDA; on a CPU machine ``test_triton_suite_under_interpreter`` reruns this file and
test_newton_schulz_triton.py under TRITON_INTERPRET=1 in a subprocess (tiny shapes). Inputs are fresh
random draws each run (the seed is in the failure message); outputs start NaN-filled (``nan_empty``).
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops import use
from laplacianformer.ops.kernel import laplace_kernel, laplace_kernel_matmul
from laplacianformer.ops.kernel.limits import TRITON_KERNEL_IDS
from laplacianformer.ops.kernel_families import KERNEL_FAMILIES
from laplacianformer.ops.kernel.naive import laplace_kernel_matmul_naive, laplace_kernel_naive

pytestmark = pytest.mark.triton
RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not RUNS_HERE, reason="needs CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"

SHAPES = [(2, 37, 19, 5, 3), (1, 50, 33, 20, 17), (1, 23, 49, 32, 32), (1, 21, 18, 70, 40), (1, 130, 70, 19, 72)]
"""(B, N, M, d, e). (1, 21, 18, 70, 40) runs d in the backward as four 32-wide chunks (the last one ragged)
and e as two; the last one, in the forward, three 64-row blocks, two 64-landmark blocks (the second one's
upper half past M), two 64-wide slices of e (the second ragged) and d as two unrolled 8-feature steps plus
three single ones."""
TOL = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 5e-3}
SPECS = {spec.id: spec for spec in KERNEL_FAMILIES.values()}
PROFILE_FAMILIES = [SPECS[kid].name for kid in sorted(TRITON_KERNEL_IDS) if not SPECS[kid].exp_of_accumulation]
"""The families whose Triton profile is not the in-place exp of the Laplacian and the Gaussian (docs/KERNELS.md,
"Kernel families"): one case per op each."""


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a.double() - b.double()).norm() / b.double().norm().clamp_min(1e-30)).item()


def _inputs(shape, dtype, seeded):
    seed, gen = seeded
    b, n, m, d, e = shape
    x, y, v = (torch.randn(b, k, c, generator=gen) * 0.3 for k, c in ((n, d), (m, d), (m, e)))
    return seed, [t.to(DEVICE, dtype).requires_grad_() for t in (x, y, v)]


def _check(op, ref, args, kind, dtype, seed):
    with use(kernel="triton"):
        out = op(*args, 2.0, kind)
    ref_args = [a.detach().double().requires_grad_() for a in args]
    want = ref(*ref_args, 2.0, kind)
    assert torch.isfinite(out).all(), f"seed {seed}: non-finite output"
    assert _rel(out, want) < TOL[dtype], f"seed {seed}: output rel err {_rel(out, want):.2e}"
    grad = torch.randn_like(out)
    got = torch.autograd.grad(out, args, grad)
    exp = torch.autograd.grad(want, ref_args, grad.double())
    for name, g, r in zip("xyv", got, exp):
        assert torch.isfinite(g).all(), f"seed {seed}: non-finite d{name}"
        assert _rel(g, r) < TOL[dtype] * 4, f"seed {seed}: d{name} rel err {_rel(g, r):.2e}"


@needs_triton
@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matrix_matches_naive(nan_empty, kind, shape, seeded):
    seed, (x, y, _) = _inputs(shape, torch.float32, seeded)
    _check(laplace_kernel, laplace_kernel_naive, [x, y], kind, torch.float32, seed)


@needs_triton
@pytest.mark.parametrize("kind", ["laplacian", "gaussian"])
@pytest.mark.parametrize("shape", SHAPES)
def test_kernel_matmul_matches_naive(nan_empty, kind, shape, seeded):
    seed, args = _inputs(shape, torch.float32, seeded)
    _check(laplace_kernel_matmul, laplace_kernel_matmul_naive, args, kind, torch.float32, seed)


@needs_triton
@pytest.mark.parametrize("op", ["kernel", "matmul"])
@pytest.mark.parametrize("kind", PROFILE_FAMILIES)
def test_kernel_families_match_naive(nan_empty, kind, op, seeded):
    """d = 40 (the backward's two 32-wide chunks; without V the recomputed distance loops over both) and rows of x
    equal to rows of y: r = 0, where the L2 families' slope is 0 (docs/DESIGN.md §1.5)."""
    seed, (x, y, v) = _inputs((1, 23, 19, 40, 20), torch.float32, seeded)
    x = x.detach().clone()
    x[:, :4] = y[:, :4].detach()
    x.requires_grad_()
    if op == "kernel":
        _check(laplace_kernel, laplace_kernel_naive, [x, y], kind, torch.float32, seed)
    else:
        _check(laplace_kernel_matmul, laplace_kernel_matmul_naive, [x, y, v], kind, torch.float32, seed)


if RUNS_HERE:
    import triton
    import triton.language as tl

    from laplacianformer.ops._triton_common import kernel_chain, kernel_slope, kernel_value

    @triton.jit
    def _profile_kernel(ACC, DK, K, SLOPE, CHAIN, n, scale, KID: tl.constexpr, BLOCK: tl.constexpr):
        """k, dk/d(acc) and dL/d(acc) of family id KID at the accumulated distances ACC (n,), dL/dk = DK, scale =
        −1 / λ."""
        r = tl.arange(0, BLOCK)
        ok = r < n
        acc = tl.load(ACC + r, mask=ok, other=0.0)
        k = kernel_value(acc, scale, KID)
        tl.store(K + r, k, mask=ok)
        tl.store(SLOPE + r, kernel_slope(acc, k, scale, KID), mask=ok)
        tl.store(CHAIN + r, kernel_chain(tl.load(DK + r, mask=ok, other=0.0), k, acc, scale, KID, False), mask=ok)


def test_profile_table_is_the_registrys():
    """``_triton_common.PROFILES`` (the Triton profile, id -> (distance, form)) has the ids of
    ``kernel.limits.TRITON_KERNEL_IDS`` (what the registry's refusals read without Triton), each the distance of its
    registry spec."""
    pytest.importorskip("triton")
    from laplacianformer.ops._triton_common import PROFILES, family_sums_abs

    assert set(PROFILES) == TRITON_KERNEL_IDS
    for kid, (distance, _form) in PROFILES.items():
        assert kid in SPECS and SPECS[kid].distance == distance and family_sums_abs(kid) == SPECS[kid].l1, kid


@needs_triton
@pytest.mark.parametrize("kid", sorted(TRITON_KERNEL_IDS))
def test_profile_equals_the_registry(kid, seeded):
    """The Triton profile of each id against its registry spec in float64: k = f(r / λ) and dk/d(acc) at
    accumulated distances from 0 (the L2 families' slope 0 there) to 200, and the chain rule dL/d(acc)."""
    spec = SPECS[kid]
    _, gen = seeded
    acc = torch.tensor([0.0, 1e-12, 1e-6, 1e-3, 0.1, 0.5, 1.0, 2.0, 5.0, 10.0, 50.0, 200.0])
    dk = torch.randn(acc.shape, generator=gen)
    inv_bw = 0.7
    out = [torch.full_like(acc, float("nan")).to(DEVICE) for _ in range(3)]
    _profile_kernel[(1,)](acc.to(DEVICE), dk.to(DEVICE), *out, acc.numel(), -inv_bw, KID=kid, BLOCK=16)
    k, slope, chain = (t.cpu().double() for t in out)
    acc64 = acc.double()
    k64 = spec.kernel_of(acc64, inv_bw)
    slope64 = spec.slope_of(acc64, k64, inv_bw)
    assert _rel(k, k64) < 1e-6 and (k - k64).abs().max() < 1e-6 * k64.abs().max(), (spec.name, k, k64)
    assert ((slope - slope64).abs() <= 1e-6 * slope64.abs() + 1e-12).all(), (spec.name, slope, slope64)
    assert ((chain - dk.double() * slope64).abs() <= 2e-6 * (dk.double() * slope64).abs() + 1e-12).all()
    if spec.distance == "l2":
        assert slope[0] == 0.0 and chain[0] == 0.0  # r = 0: the minimal-norm subgradient


@needs_triton
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_inputs_accumulate_in_float32(nan_empty, dtype, seeded):
    seed, args = _inputs((1, 40, 21, 16, 16), dtype, seeded)
    _check(laplace_kernel_matmul, laplace_kernel_matmul_naive, args, "laplacian", dtype, seed)


@needs_triton
def test_leading_dims_and_sign_zero_convention(nan_empty, seeded):
    """(B, H, N, d) inputs; x_n == y_m exactly gives sign(0) = 0, as the naive autograd does."""
    seed, (x, y, _) = _inputs((6, 20, 17, 8, 1), torch.float32, seeded)
    x = x.detach().reshape(2, 3, 20, 8)
    y = y.detach().reshape(2, 3, 17, 8)
    x[:, :, :5] = y[:, :, :5]
    x.requires_grad_()
    y.requires_grad_()
    _check(laplace_kernel, laplace_kernel_naive, [x, y], "laplacian", torch.float32, seed)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="torch.compile of the Triton ops needs CUDA")
def test_compiles_without_graph_breaks_on_cuda(seeded):
    seed, (x, y, v) = _inputs((2, 300, 49, 32, 32), torch.float32, seeded)

    def f(a, b, c):
        return laplace_kernel(a, b, 4.0).sum() + laplace_kernel_matmul(a, b, c, 4.0).square().sum()

    with use(kernel="triton"):
        out = torch.compile(f, fullgraph=True)(x, y, v)
        got = torch.autograd.grad(out, (x, y, v))
    ref_args = [t.detach().double().requires_grad_() for t in (x, y, v)]
    with use(kernel="naive"):
        ref = f(*ref_args)
    exp = torch.autograd.grad(ref, ref_args)
    assert _rel(out, ref) < 1e-5, f"seed {seed}"
    for g, r in zip(got, exp):
        assert _rel(g, r) < 1e-4, f"seed {seed}"


def test_triton_suite_under_interpreter(triton_interpreter):
    if RUNS_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_kernel_triton.py")  # the Newton–Schulz file has its own run
