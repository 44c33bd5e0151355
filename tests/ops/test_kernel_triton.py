"""Fused Triton kernels (ops/kernel/triton.py) against the naive reference: values and every gradient.

Runs for real on CUDA; on a CPU machine ``test_triton_suite_under_interpreter`` reruns this file and
test_newton_schulz_triton.py under TRITON_INTERPRET=1 in a subprocess (tiny shapes). Inputs are fresh
random draws each run (the seed is in the failure message); outputs start NaN-filled (``nan_empty``).
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops import use
from laplacianformer.ops.kernel import laplace_kernel, laplace_kernel_matmul
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
    triton_interpreter("tests/ops/test_kernel_triton.py", "tests/ops/test_newton_schulz_triton.py")
