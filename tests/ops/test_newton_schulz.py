"""Regularised inverse: Newton–Schulz convergence, implicit gradient, CG baseline."""

import pytest
import torch

from laplacianformer import newton_schulz_pinv, regularised_inverse
from laplacianformer.ops.kernel import laplace_kernel_naive
from laplacianformer.ops.newton_schulz import conjugate_gradient_inverse, initial_guess, pinv_residual


def spd(batch=(2, 3), m=12, cond=10.0, dtype=torch.float64):
    """Random SPD matrices with a given condition number."""
    q, _ = torch.linalg.qr(torch.randn(*batch, m, m, dtype=dtype))
    eig = torch.logspace(0, -torch.log10(torch.tensor(cond)).item(), m, dtype=dtype)
    return q @ torch.diag_embed(eig) @ q.transpose(-1, -2)


def test_residual_falls_below_1e_6_on_well_conditioned_spd():
    w = spd(cond=10.0)
    v, res = newton_schulz_pinv(w, iters=30, eps=0.0, return_residual=True)
    assert res.shape == (2, 3)
    assert (res < 1e-6).all(), res
    torch.testing.assert_close(v, torch.linalg.inv(w), rtol=1e-7, atol=1e-8)


def test_residual_on_landmark_kernel_matrices():
    x = torch.randn(4, 49, 32, dtype=torch.float64) * 32**-0.5
    w = laplace_kernel_naive(x, x, 4.0)
    _, res = newton_schulz_pinv(w, iters=20, eps=0.01, return_residual=True)
    assert (res < 1e-6).all(), res


def test_alpha_is_per_matrix():
    w = torch.stack([spd((), 6), 100 * spd((), 6)])
    alone = newton_schulz_pinv(w[1:], iters=40, eps=0.0)
    together = newton_schulz_pinv(w, iters=40, eps=0.0)
    torch.testing.assert_close(together[1:], alone)
    v0 = initial_guess(w)
    assert not torch.allclose(v0[0] / w[0], v0[1] / w[1])


def test_implicit_gradient_matches_linalg_inv():
    w = spd((2,), 8)
    g = torch.randn(2, 8, 8, dtype=torch.float64)
    a = w.clone().requires_grad_()
    (newton_schulz_pinv(a, iters=40, eps=0.0) * g).sum().backward()
    b = w.clone().requires_grad_()
    (torch.linalg.inv(b) * g).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-7, atol=1e-9)


def test_unrolled_backward_matches_when_converged():
    w = spd((2,), 6)
    g = torch.randn(2, 6, 6, dtype=torch.float64)
    a = w.clone().requires_grad_()
    (newton_schulz_pinv(a, iters=40, eps=0.0, backward="unrolled") * g).sum().backward()
    b = w.clone().requires_grad_()
    (torch.linalg.inv(b) * g).sum().backward()
    torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=1e-8)


@pytest.mark.parametrize("solver", ["newton_schulz", "cg", "exact"])
def test_gradcheck_solvers(solver):
    w = spd((2,), 5).requires_grad_()
    fn = lambda x: regularised_inverse(x, solver=solver, iters=40, eps=0.01)
    assert torch.autograd.gradcheck(fn, (w,), eps=1e-6, atol=1e-5)


def test_cg_inverse_converges_in_m_steps():
    w = spd((3,), 10, cond=50.0)
    x = conjugate_gradient_inverse(w, iters=10)
    assert (pinv_residual(w, x) < 1e-6).all()


def test_half_precision_inputs_are_solved_in_float32():
    x = torch.randn(2, 16, 8) * 8**-0.5
    w = laplace_kernel_naive(x, x, 4.0).to(torch.bfloat16)
    v = newton_schulz_pinv(w)
    assert v.dtype == torch.bfloat16 and torch.isfinite(v).all()
