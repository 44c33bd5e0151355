"""Batched Newton–Schulz Triton kernels (ops/newton_schulz/triton.py) against the reference solver.

Runs for real on CUDA, and under TRITON_INTERPRET=1 through test_kernel_triton.py's subprocess. Inputs
come from the fixed, printed seeds of the ``seeded`` fixture (tests/ops/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
from unittest import mock

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


@contextlib.contextmanager
def _launched():
    """The names of the Triton kernels launched meanwhile (they still run)."""
    from triton.runtime.interpreter import InterpretedFunction
    from triton.runtime.jit import JITFunction

    names = []

    def recorder(original):
        def run(self, *args, **kwargs):
            if not kwargs.get("warmup"):
                names.append(self.fn.__name__)
            return original(self, *args, **kwargs)
        return run

    with mock.patch.object(JITFunction, "run", recorder(JITFunction.run)), \
            mock.patch.object(InterpretedFunction, "run", recorder(InterpretedFunction.run)):
        yield names


@needs_triton
@pytest.mark.parametrize("m", [1, 4, 16, 49, 64, 65, 128])
def test_forward_and_implicit_grad_match_reference(nan_empty, m, seeded):
    """On chip up to m = 64 (block sides 16, 32, 64), the tiled kernels from m = 65."""
    from laplacianformer.ops.newton_schulz import triton as nt
    from laplacianformer.ops.newton_schulz.triton import implicit_grad_triton, newton_schulz_iterate_triton

    seed, p, g = _landmark_system(3, m, seeded)
    with _launched() as names:
        v = newton_schulz_iterate_triton(p.to(DEVICE), 20)
    onchip = m <= nt.ONCHIP_MAX_M
    assert names == ["newton_schulz_onchip_kernel" if onchip else "newton_schulz_fwd_kernel"], names
    ref = newton_schulz_iterate(p.double(), 20)
    assert _rel(v.cpu(), ref) < 1e-5, f"seed {seed}: V rel err {_rel(v.cpu(), ref):.2e}"
    with _launched() as names:
        dw = implicit_grad_triton(v, g.to(DEVICE))
    assert names == ["implicit_grad_onchip_kernel" if onchip else "implicit_grad_kernel"], names
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


def _ill_conditioned(batch, m, cond, gen):
    """Symmetric positive definite (batch, m, m) with eigenvalues log-spaced from 1 down to 1/cond."""
    q, _ = torch.linalg.qr(torch.randn(batch, m, m, generator=gen, dtype=torch.float64))
    lam = torch.logspace(0, -torch.log10(torch.tensor(float(cond))).item(), m, dtype=torch.float64)
    return (q * lam) @ q.transpose(-1, -2)


@needs_triton
def test_64_matrices_49x49_within_1e5_of_float64(nan_empty, seeded):
    """The model's solve (B·H = 64, m = 49, 20 steps) in one launch, condition 1 .. 1e3 across the batch:
    each matrix within 1e-5 (relative, Frobenius) of the same iteration in float64. Under the interpreter
    (which runs every product in float32 whatever its precision, one program after another) 16 matrices
    over the same range."""
    from laplacianformer.ops.newton_schulz.triton import newton_schulz_iterate_triton

    seed, gen = seeded
    conds = torch.logspace(0, 3, 64 if torch.cuda.is_available() else 16, dtype=torch.float64)
    p = torch.cat([_ill_conditioned(1, 49, c, gen) for c in conds])
    got = newton_schulz_iterate_triton(p.float().to(DEVICE), 20).cpu()
    want = newton_schulz_iterate(p.float().double(), 20)
    err = torch.tensor([_rel(a, b) for a, b in zip(got, want)])
    assert (err < 1e-5).all(), f"seed {seed}: worst {err.max():.2e} at condition {conds[err.argmax()]:.0f}"


def test_onchip_configuration():
    pytest.importorskip("triton")
    from laplacianformer.ops.newton_schulz import triton as nt

    assert nt.PRECISION in ("ieee", "tf32x3")  # never plain TF32 (1e-3 .. 1e-2 off)
    assert [nt.onchip_config(m)["BM"] for m in (1, 16, 17, 32, 49, 64)] == [16, 16, 32, 32, 64, 64]
    with pytest.raises(ValueError, match="m: expected at most 64"):
        nt.onchip_config(65)


def test_check_schedule_is_the_reference_one():
    from laplacianformer.ops.newton_schulz import CHECK_EVERY
    from laplacianformer.ops.newton_schulz import triton as ns_triton

    assert ns_triton.CHECK_EVERY == CHECK_EVERY


@needs_triton
@pytest.mark.parametrize("m", [24, 49, 65])
def test_keep_best_matches_the_reference_on_ill_conditioned_matrices(nan_empty, m, seeded):
    """Float32, eps = 0, condition 1e3 .. 1e6 (one matrix each, one launch; on chip at m = 24 and 49, tiled at
    65): the iteration stalls at a
    rounding floor; both solvers keep the best checked iterate (checks at 5, 10, ... and the last step).
    The Triton result is finite, its residual is the reference's up to that floor, and the iterates agree
    to float32 rounding amplified by the conditioning."""
    from laplacianformer.ops.newton_schulz.naive import newton_schulz_iterate_reference
    from laplacianformer.ops.newton_schulz.triton import newton_schulz_iterate_triton

    seed, gen = seeded
    # the tiled kernel (m = 65) is slow under the interpreter: the two ends of the range there
    conds = torch.tensor([1e3, 1e4, 1e5, 1e6] if m <= 64 else [1e3, 1e6], dtype=torch.float64)
    p = torch.cat([_ill_conditioned(1, m, c, gen) for c in conds]).float()
    eye = torch.eye(m, dtype=torch.float64)
    for iters in (7, 40):
        got = newton_schulz_iterate_triton(p.to(DEVICE), iters).cpu()
        want = newton_schulz_iterate_reference(p, iters)
        assert torch.isfinite(got).all(), f"seed {seed}: {iters} steps: non-finite"
        res_got = torch.linalg.matrix_norm(eye - p.double() @ got.double())
        res_want = torch.linalg.matrix_norm(eye - p.double() @ want.double())
        assert ((res_got - res_want).abs() <= 0.5 * res_want + 1e-3).all(), (
            f"seed {seed}: {iters} steps: residual {res_got.tolist()} vs reference {res_want.tolist()}")
        err = torch.tensor([_rel(g, w) for g, w in zip(got, want)], dtype=torch.float64)
        assert (err < 1e-6 * conds + 1e-4).all(), f"seed {seed}: {iters} steps: rel err {err.tolist()}"


@needs_triton
def test_keep_best_holds_back_a_diverging_iterate(nan_empty, seeded):
    """A matrix whose alpha is pushed past 2/sigma_max^2 would diverge: fed a scaled non-symmetric-norm
    case (negative eigenvalue), the residual grows from the start and both keep the initial guess."""
    from laplacianformer.ops.newton_schulz.naive import newton_schulz_iterate_reference
    from laplacianformer.ops.newton_schulz.triton import newton_schulz_iterate_triton

    seed, gen = seeded
    q, _ = torch.linalg.qr(torch.randn(2, 16, 16, generator=gen, dtype=torch.float64))
    lam = torch.linspace(1.0, -1.0, 16, dtype=torch.float64)  # indefinite: V <- 2V - VPV diverges
    p = ((q * lam) @ q.transpose(-1, -2)).float()
    got = newton_schulz_iterate_triton(p.to(DEVICE), 60).cpu()
    want = newton_schulz_iterate_reference(p, 60)
    assert torch.isfinite(got).all() and torch.isfinite(want).all(), f"seed {seed}"
    assert _rel(got, want) < 1e-4, f"seed {seed}: rel err {_rel(got, want):.2e}"


def test_registry_limits_are_the_checked_ones():
    """The Triton backends' refusals cover what benchmarks/triton_aot.py compiles and checks."""
    pytest.importorskip("triton")
    from laplacianformer.ops import kernel as kernel_ops
    from laplacianformer.ops import newton_schulz as ns_ops
    from laplacianformer.ops.kernel import triton as kt
    from laplacianformer.ops.newton_schulz import triton as nt

    assert (kernel_ops.TRITON_MAX_D, kernel_ops.TRITON_MAX_E) == (kt.MAX_D, kt.MAX_E) == (128, 128)
    assert ns_ops.TRITON_MAX_M == nt.MAX_M


def test_triton_suite_under_interpreter(triton_interpreter):
    """On a CPU machine the Triton tests above rerun under TRITON_INTERPRET=1 in a subprocess, so the default
    suite compares the on-chip and tiled kernels with their references."""
    if RUNS_HERE:
        pytest.skip("the Triton tests run in this process")
    pytest.importorskip("triton")
    triton_interpreter("tests/ops/test_newton_schulz_triton.py", timeout=300.0)
