"""Batched Newton–Schulz Triton kernels (ops/newton_schulz/triton.py) against the reference solver.

Runs for real on CUDA, and under TRITON_INTERPRET=1 through test_kernel_triton.py's subprocess. Inputs
come from the fixed, printed seeds of the ``seeded`` fixture (tests/ops/conftest.py).
"""

from __future__ import annotations

import os

import pytest
import torch

from laplacianformer.ops.kernel.naive import laplace_kernel_naive
from laplacianformer.ops.newton_schulz import regularised_inverse
from laplacianformer.ops.newton_schulz import newton_schulz_iterate, regularise

pytestmark = pytest.mark.triton
RUNS_HERE = torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
needs_triton = pytest.mark.skipif(not RUNS_HERE, reason="needs CUDA or TRITON_INTERPRET=1")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _rel(a, b):
    return ((a.double() - b.double()).norm() / b.double().norm()).item()


def _landmark_system(batch, m, seeded):
    seed, gen = seeded
    x = torch.randn(batch, m, 8, generator=gen) * 0.5
    p = regularise(laplace_kernel_naive(x, x, 4.0), 0.01)
    return seed, p, torch.randn(batch, m, m, generator=gen)


@needs_triton
@pytest.mark.parametrize("m", [7, 49, 100])
def test_forward_and_implicit_grad_match_reference(nan_empty, m, seeded):
    from laplacianformer.ops.newton_schulz.triton import implicit_grad_triton, newton_schulz_iterate_triton

    seed, p, g = _landmark_system(3, m, seeded)
    v = newton_schulz_iterate_triton(p.to(DEVICE), 20)
    ref = newton_schulz_iterate(p.double(), 20)
    assert _rel(v.cpu(), ref) < 1e-5, f"seed {seed}: V rel err {_rel(v.cpu(), ref):.2e}"
    dw = implicit_grad_triton(v, g.to(DEVICE))
    rt = ref.transpose(-1, -2)
    want = -(rt @ g.double() @ rt)
    assert _rel(dw.cpu(), want) < 1e-5, f"seed {seed}: dW rel err {_rel(dw.cpu(), want):.2e}"


@needs_triton
def test_bfloat16_input(nan_empty, seeded):
    from laplacianformer.ops.newton_schulz.triton import newton_schulz_iterate_triton

    seed, p, _ = _landmark_system(2, 49, seeded)
    v = newton_schulz_iterate_triton(p.to(DEVICE, torch.bfloat16), 20)
    ref = newton_schulz_iterate(p.to(torch.bfloat16).double(), 20)
    assert v.dtype == torch.bfloat16
    assert _rel(v.float().cpu(), ref) < 3e-2, f"seed {seed}"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="dispatch to the Triton solver happens on CUDA")
def test_regularised_inverse_dispatches_on_cuda(seeded):
    seed, p, g = _landmark_system(4, 49, seeded)
    w = (p - 0.01 * torch.eye(49)).cuda().requires_grad_()
    v = regularised_inverse(w, iters=20, eps=0.01)
    v.backward(g.cuda())
    ref_w = (p - 0.01 * torch.eye(49)).double().requires_grad_()
    ref = regularised_inverse(ref_w, iters=20, eps=0.01)
    ref.backward(g.double())
    assert _rel(v.detach().cpu(), ref.detach()) < 1e-5, f"seed {seed}"
    assert _rel(w.grad.cpu(), ref_w.grad) < 1e-5, f"seed {seed}"
