"""Kernel families (``ops/kernel_families.py``, docs/DESIGN.md §1.5): every registered family on every CPU
backend that serves it equals a dense float64 formula, exact and Nyström, values and gradients; gradients at
r = 0 are finite; an unknown name is refused naming ``kernel``; a family registered at run time runs through
every backend that declares it and is refused, with a reason, by those that do not."""

from __future__ import annotations

import math

import pytest
import torch

from laplacianformer import laplacian_attention
from laplacianformer.ops import explain, use
from laplacianformer.ops import kernel as K
from laplacianformer.ops.kernel import cpu as kcpu
from laplacianformer.ops.kernel import native
from laplacianformer.ops.kernel_families import (
    KERNEL_FAMILIES,
    SHIPPED,
    KernelSpec,
    kernel_names,
    kernel_spec,
    register_kernel_family,
    unregister_kernel_family,
)
from laplacianformer.ops.newton_schulz import regularise
from laplacianformer.ops.normalization import normalize_dense
from laplacianformer.ops.pooling import pool_landmarks

FAMILIES = kernel_names()
CPU_BACKENDS = ("naive", "composite", "cpu")

# the shipped families written out from their definitions (docs/DESIGN.md §1.5), independently of the specs
_S3 = math.sqrt(3.0)
FORMULAS = {
    "laplacian": lambda x, y, lam: torch.exp(-_l1(x, y) / lam),
    "gaussian": lambda x, y, lam: torch.exp(-_l2(x, y) ** 2 / lam),
    "exponential": lambda x, y, lam: torch.exp(-_l2(x, y) / lam),
    "matern32": lambda x, y, lam: (1 + _S3 * _l2(x, y) / lam) * torch.exp(-_S3 * _l2(x, y) / lam),
    "cauchy": lambda x, y, lam: 1.0 / (1.0 + _l2(x, y) ** 2 / lam),
}


def _l1(x, y):
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).abs().sum(-1)


def _l2(x, y):
    return (x.unsqueeze(-2) - y.unsqueeze(-3)).square().sum(-1).sqrt()


def _dense(name):
    return FORMULAS[name] if name in FORMULAS else (lambda x, y, lam: K.laplace_kernel_naive(x, y, lam, name))


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def _inputs(gen, b=2, n=23, m=9, d=5, e=3):
    x = torch.randn(b, n, d, dtype=torch.float64, generator=gen) * 0.5
    y = torch.randn(b, m, d, dtype=torch.float64, generator=gen) * 0.5
    v = torch.randn(b, m, e, dtype=torch.float64, generator=gen)
    return x, y, v


def _served(backend: str) -> None:
    if backend == "cpu" and native.load() is None:
        pytest.skip(f"C loops unavailable: {native.load_error()}")


def test_every_shipped_family_has_a_written_formula():
    assert set(SHIPPED) == set(FORMULAS) and len({kernel_spec(n).id for n in SHIPPED}) == len(SHIPPED)


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kernel_and_product_equal_the_dense_formula(name, backend, seeded):
    _served(backend)
    seed, gen = seeded
    x, y, v = _inputs(gen)
    with use(kernel=backend):
        c = K.laplace_kernel(x, y, 1.7, name)
        o = K.laplace_kernel_matmul(x, y, v, 1.7, name)
    ref = _dense(name)(x, y, 1.7)
    assert _rel(c, ref) < 1e-13, seed
    assert _rel(o, ref @ v) < 1e-13, seed


@pytest.mark.parametrize("name", FAMILIES)
@pytest.mark.parametrize("backend", CPU_BACKENDS)
def test_kernel_gradients_pass_gradcheck(name, backend, seeded):
    _served(backend)
    seed, gen = seeded
    x, y, v = (t[:1, :7].clone().requires_grad_() for t in _inputs(gen))
    y = y.detach()[:, :4].requires_grad_()
    v = v.detach()[:, :4].requires_grad_()
    with use(kernel=backend):
        assert torch.autograd.gradcheck(lambda a, b: K.laplace_kernel(a, b, 1.3, name), (x, y)), seed
        assert torch.autograd.gradcheck(lambda a, b, c: K.laplace_kernel_matmul(a, b, c, 1.3, name), (x, y, v)), seed


@pytest.mark.parametrize("name", FAMILIES)
def test_float32_cpu_path_matches_float64(name, seeded):
    """The C loops (or their PyTorch fallback) in float32, values and gradients, against float64."""
    seed, gen = seeded
    x, y, v = _inputs(gen, n=67, m=19, d=9, e=5)
    grads = {}
    for dtype in (torch.float32, torch.float64):
        ins = [t.to(dtype).requires_grad_() for t in (x, y, v)]
        c = kcpu.laplace_kernel_cpu(ins[0], ins[1], 2.0, name)
        o = kcpu.laplace_kernel_matmul_cpu(*ins, 2.0, name)
        (c.square().sum() + o.square().sum()).backward()
        grads[dtype] = [c, o] + [t.grad for t in ins]
    for label, a, b in zip(("C", "out", "dx", "dy", "dv"), grads[torch.float32], grads[torch.float64]):
        assert _rel(a.double(), b) < 2e-5, f"seed {seed}: {label} ({name})"


def _materialised_nystrom(q, k, hw, grid, lam, name, ns_eps):
    marks = pool_landmarks(q, hw, grid)
    f = _dense(name)
    w_inv = torch.linalg.inv(regularise(f(marks, marks, lam), ns_eps))
    return f(q, marks, lam) @ w_inv @ f(k, marks, lam).transpose(-1, -2)


@pytest.mark.parametrize("name", FAMILIES)
def test_attention_equals_dense_float64_exact_and_nystrom(name, seeded):
    """laplacian_attention with this family: the exact kernel (landmarks=None) and Nyström with an exact
    solver equal the normalisation of the materialised N×N similarity (docs/DESIGN.md §2, §4)."""
    seed, gen = seeded
    q, k, v = (torch.randn(2, 2, 35, 6, dtype=torch.float64, generator=gen) for _ in range(3))
    hw, grid, lam = (5, 7), (3, 4), 2.5
    opts = dict(lam=lam, qk_scale=1.0, kernel=name, norm_scale="one")
    exact = laplacian_attention(q, k, v, hw=hw, landmarks=None, **opts)
    assert _rel(exact, normalize_dense(_dense(name)(q, k, lam), v, "injective")) < 1e-10, seed
    nys = laplacian_attention(q, k, v, hw=hw, landmarks=grid, solver="exact", **opts)
    ref = normalize_dense(_materialised_nystrom(q, k, hw, grid, lam, name, 0.01), v, "injective")
    assert _rel(nys, ref) < 1e-9, seed


@pytest.mark.parametrize("name", FAMILIES)
def test_nystrom_path_passes_gradcheck(name, seeded):
    seed, gen = seeded
    q, k, v = (torch.randn(1, 1, 12, 3, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))

    def f(a, b, c):
        return laplacian_attention(a, b, c, hw=(3, 4), landmarks=(2, 2), solver="exact", kernel=name, lam=1.5)

    assert torch.autograd.gradcheck(f, (q, k, v)), seed


@pytest.mark.parametrize("name", FAMILIES)
def test_defaults_and_bandwidth_come_from_the_spec(name):
    spec = kernel_spec(name)
    q, k, v = (torch.randn(1, 1, 16, 8, dtype=torch.float64) for _ in range(3))
    out = laplacian_attention(q, k, v, landmarks=None, kernel=name, norm="none")
    s, lam = spec.default_qk_scale(8), spec.default_lam(8)
    ref = laplacian_attention(q * s, k * s, v, landmarks=None, kernel=name, norm="none", lam=lam, qk_scale=1.0)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name", FAMILIES)
def test_gradients_at_zero_distance_are_finite(name):
    """Equal tokens (r = 0: W's diagonal, a query equal to a landmark) give finite gradients; the L2
    direction is taken as 0 there, as sign(0) = 0 for L1 (docs/DESIGN.md §1.5)."""
    base = torch.randn(1, 1, 1, 4, dtype=torch.float64)
    q = base.expand(1, 1, 16, 4).clone().requires_grad_()  # every token equal: every distance is 0
    k = q.detach().clone().requires_grad_()
    v = torch.randn(1, 1, 16, 4, dtype=torch.float64, requires_grad=True)
    out = laplacian_attention(q, k, v, hw=(4, 4), landmarks=(2, 2), kernel=name)
    out.square().sum().backward()
    for t in (q, k, v):
        assert torch.isfinite(t.grad).all(), name
    x = torch.zeros(1, 2, 3, dtype=torch.float64, requires_grad=True)
    with use(kernel="cpu" if native.load() is not None else "composite"):
        K.laplace_kernel(x, x, 1.0, name).sum().backward()
    assert torch.isfinite(x.grad).all() and x.grad.abs().max() == 0, name


def test_unknown_family_is_refused_naming_kernel():
    x = torch.randn(1, 4, 3)
    for call in (lambda: K.laplace_kernel(x, x, 1.0, "cauchyy"),
                 lambda: laplacian_attention(x[None], x[None], x[None], kernel="nope"),
                 lambda: kcpu.laplace_kernel_cpu(x, x, 1.0, "nope")):
        with pytest.raises(ValueError, match=r"^kernel: expected one of \['laplacian'"):
            call()


def _inverse_multiquadric(u):
    return torch.rsqrt(1.0 + u)


def _inverse_multiquadric_slope(u):
    return -0.5 * (1.0 + u) ** -1.5


@pytest.fixture
def throwaway():
    """A family the package does not ship: k = (1 + ||x - y||² / lam)^-1/2, registered for one test."""
    spec = register_kernel_family(KernelSpec(
        "inverse_multiquadric_test", 97, "sq_l2", _inverse_multiquadric, _inverse_multiquadric_slope,
        lambda d: 1.0, lambda d: d ** -0.5, summary="(1 + r^2 / lam)^-1/2 (a test's)"))
    yield spec
    unregister_kernel_family(spec.name)
    assert spec.name not in KERNEL_FAMILIES


def test_a_registered_family_runs_through_every_backend_that_declares_it(throwaway, seeded):
    """One registry entry and its profile: the naive, composite and C backends compute it (values and
    gradients equal its formula), the attention runs it exact and Nyström, forward and backward; the
    Triton backends, which have no profile for its id, refuse it with that reason."""
    seed, gen = seeded
    name = throwaway.name
    x, y, v = _inputs(gen)
    ref = (1.0 + _l2(x, y) ** 2 / 1.7) ** -0.5
    for backend in CPU_BACKENDS:
        _served(backend)
        with use(kernel=backend):
            assert _rel(K.laplace_kernel(x, y, 1.7, name), ref) < 1e-13, (backend, seed)
            xs, ys = x[:1, :5].clone().requires_grad_(), y[:1, :3].clone().requires_grad_()
            assert torch.autograd.gradcheck(lambda a, b: K.laplace_kernel(a, b, 1.7, name), (xs, ys)), backend
    q, k, vv = (torch.randn(1, 2, 20, 4, dtype=torch.float64, generator=gen).requires_grad_() for _ in range(3))
    out = laplacian_attention(q, k, vv, hw=(4, 5), landmarks=(2, 2), kernel=name)
    out.sum().backward()
    assert torch.isfinite(out).all() and all(torch.isfinite(t.grad).all() for t in (q, k, vv))
    report = explain("kernel", x.float(), y.float(), 1.7, name)
    assert f"kernel {name!r}: the Triton kernels have no profile for its id 97" in report
