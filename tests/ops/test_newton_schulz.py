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


# --- The C loop of the CPU path (ops/newton_schulz/native.py) against the torch reference -------------

import importlib.util
from pathlib import Path

from laplacianformer.ops._clib import CLibrary
from laplacianformer.ops.newton_schulz import native as ns_native
from laplacianformer.ops.newton_schulz import newton_schulz_iterate
from laplacianformer.ops.newton_schulz.naive import CHECK_EVERY, newton_schulz_iterate_reference, regularise

NATIVE_M = [1, 2, 7, 16, 49, 64, 100]
NATIVE_G = [1, 3, 8]
NATIVE_TOL = {torch.float64: dict(rtol=1e-11, atol=1e-11), torch.float32: dict(rtol=1e-4, atol=1e-4)}


@pytest.fixture
def c_loop():
    if ns_native.load() is None:
        pytest.skip(f"C Newton–Schulz loop unavailable: {ns_native.load_error()}")


def _native(p, iters, tol=None, threads=None):
    return ns_native.newton_schulz_native(p, iters, tol, CHECK_EVERY, threads)


def _assert_matches_reference(p, iters, tol=None):
    """C loop = torch loop to float rounding, scaled by the size of V."""
    ref = newton_schulz_iterate_reference(p, iters, tol)
    out = _native(p, iters, tol)
    assert out.dtype == p.dtype and out.shape == p.shape
    scale = ref.abs().amax().item()
    t = NATIVE_TOL[p.dtype]
    torch.testing.assert_close(out / scale, ref / scale, rtol=t["rtol"], atol=t["atol"])


def _numerics_cases():
    path = Path(__file__).resolve().parents[1] / "reliability" / "numerics_cases.py"
    spec = importlib.util.spec_from_file_location("_ns_numerics_cases", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m", NATIVE_M)
@pytest.mark.parametrize("g", NATIVE_G)
def test_c_loop_matches_reference_on_random_spd(c_loop, dtype, m, g):
    torch.manual_seed(1000 * m + g)
    p = regularise(spd((g,), m, cond=100.0), 0.01).to(dtype)
    for iters in (20, 13):  # 13: the final check off the CHECK_EVERY schedule
        _assert_matches_reference(p, iters)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("m", NATIVE_M)
@pytest.mark.parametrize("g", NATIVE_G)
def test_c_loop_matches_reference_on_landmark_kernels(c_loop, dtype, m, g):
    torch.manual_seed(1000 * m + g + 7)
    x = torch.randn(g, m, 32, dtype=torch.float64) * 32**-0.5
    p = regularise(laplace_kernel_naive(x, x, 4.0), 0.01).to(dtype)
    _assert_matches_reference(p, 20)


def test_c_loop_edge_iteration_counts_and_shapes(c_loop):
    p = regularise(spd((2, 3), 9), 0.01)
    for iters in (0, 1, 4, 5, 6):
        _assert_matches_reference(p, iters)
    assert _native(p, 20).shape == (2, 3, 9, 9)
    # A non-contiguous view is read like its contiguous copy.
    pt = p.transpose(-1, -2)
    assert torch.equal(_native(pt, 20), _native(pt.contiguous(), 20))
    assert _native(torch.empty(0, 5, 5, dtype=torch.float64), 20).shape == (0, 5, 5)


def test_c_loop_writes_every_element(c_loop, nan_empty):
    p = regularise(spd((3,), 49), 0.01).float()
    assert torch.isfinite(_native(p, 20)).all()


def _chosen_check(fn, p, iters):
    """Per matrix, the check (step count) whose iterate ``fn(p, iters)`` returned: the first k of the
    schedule where fn(p, k) (k steps, its last check at k) gives the same matrix bit for bit."""
    final = fn(p, iters)
    schedule = [0] + list(range(CHECK_EVERY, iters + 1, CHECK_EVERY))
    runs = {k: fn(p, k) for k in schedule}
    return [next(k for k in schedule if torch.equal(runs[k][i], final[i])) for i in range(p.shape[0])]


def test_c_loop_keeps_the_reference_choice_past_the_float32_rounding_limit(c_loop):
    """cond(P) >= 1e8 with eps = 0 in float32: the iterate blows up (then NaN) after a few checks; the C
    loop stays finite and keeps the same best check as the torch loop, per matrix of the batch."""
    cases = _numerics_cases()
    w = torch.stack([cases.landmark_kernel_with_condition(k) for k in (1e8, 1e9)])
    p = torch.cat([w, regularise(w, 1e-6)]).float()
    out = _native(p, 150)
    assert torch.isfinite(out).all()
    ref_choice = _chosen_check(newton_schulz_iterate_reference, p, 150)
    assert _chosen_check(_native, p, 150) == ref_choice
    assert all(0 < k < 150 for k in ref_choice)  # the safeguard did act
    # Rounding is amplified ~cond(P)·u >= 1 here, so the kept iterates differ, but not their quality.
    res, ref_res = pinv_residual(p, out), pinv_residual(p, newton_schulz_iterate_reference(p, 150))
    assert (res < 1.5 * ref_res).all() and (ref_res < 1.5 * res).all(), (res, ref_res)
    # The float64 counterpart converges, in both loops.
    res = pinv_residual(w, _native(w, 150))
    assert (res < 1e-6).all(), res


def test_c_loop_non_finite_inputs_match_reference(c_loop):
    """A NaN in P (alpha NaN) or P = 0 (alpha = inf, V0 = NaN): V0 is kept, as in the torch loop, and the
    other matrices of the batch are unaffected."""
    p = regularise(spd((4,), 7), 0.01)
    p[1, 2, 3] = float("nan")
    p[2] = 0.0
    out, ref = _native(p, 20), newton_schulz_iterate_reference(p, 20)
    assert torch.equal(out.isnan(), ref.isnan())
    torch.testing.assert_close(out[[0, 3]], ref[[0, 3]], rtol=1e-11, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_c_loop_tol_stops_the_whole_batch_at_the_reference_step(c_loop, dtype):
    """tol: the batch stops at the first check where every matrix is within tol; matrices that got there
    earlier keep iterating until then (same steps as the torch loop)."""
    torch.manual_seed(3)
    w = torch.cat([spd((1,), 20, cond=c) for c in (2.0, 30.0, 1000.0)])
    p = regularise(w, 0.0).to(dtype)
    tol = 1e-2
    ref = newton_schulz_iterate_reference(p, 200, tol)
    stop = next(k for k in range(CHECK_EVERY, 201, CHECK_EVERY) if torch.equal(newton_schulz_iterate_reference(p, k), ref))
    assert CHECK_EVERY < stop < 200
    out = _native(p, 200, tol)
    assert torch.equal(out, _native(p, stop))
    assert not torch.equal(out, _native(p, stop - CHECK_EVERY)) and not torch.equal(out, _native(p, stop + CHECK_EVERY))
    # the fast matrices went on past their own first check within tol
    assert not torch.equal(out[0], _native(p[:1], 200, tol)[0])
    _assert_matches_reference(p, 200, tol)
    assert (pinv_residual(p, out) <= tol * 1.01).all()
    # tol never reached: all iterations
    assert torch.equal(_native(p, 12, 1e-30), _native(p, 12))


@pytest.mark.parametrize("tol", [None, 1e-3])
def test_c_loop_result_does_not_depend_on_the_thread_count(c_loop, tol):
    torch.manual_seed(5)
    x = torch.randn(9, 49, 16) * 0.25
    p = regularise(laplace_kernel_naive(x, x, 4.0), 0.01)
    base = _native(p, 20, tol, threads=1)
    for threads in (2, 3, 9, 64):
        assert torch.equal(_native(p, 20, tol, threads=threads), base), threads


def test_newton_schulz_iterate_dispatch(c_loop, monkeypatch):
    """The C loop for plain symmetric float32/float64 CPU solves; the torch loop for gradients, symmetric=False,
    modes that must see the ops (FlopCounterMode), the forced torch backend, and without the library."""
    from torch.utils.flop_counter import FlopCounterMode

    from laplacianformer.ops import use

    calls = []
    real = ns_native.newton_schulz_native
    monkeypatch.setattr(ns_native, "newton_schulz_native", lambda *a, **k: calls.append(1) or real(*a, **k))
    p = regularise(spd((2,), 6), 0.01)

    def runs_c(fn):
        calls.clear()
        fn()
        return bool(calls)

    assert runs_c(lambda: newton_schulz_iterate(p, 20))
    assert runs_c(lambda: newton_schulz_iterate(p.float(), 20))
    assert runs_c(lambda: newton_schulz_pinv(p, 20))  # the implicit-backward forward
    assert runs_c(lambda: newton_schulz_pinv(p.clone().requires_grad_(), 20))
    assert not runs_c(lambda: newton_schulz_iterate(p.clone().requires_grad_(), 20))
    assert not runs_c(lambda: newton_schulz_pinv(p.clone().requires_grad_(), 20, backward="unrolled"))
    assert not runs_c(lambda: newton_schulz_iterate(p, 20, symmetric=False))
    assert not runs_c(lambda: newton_schulz_iterate(p.bfloat16(), 20))
    with FlopCounterMode(display=False) as counter:
        assert not runs_c(lambda: newton_schulz_iterate(p, 20))
    assert counter.get_total_flops() > 0
    with use(newton_schulz="torch"):
        assert not runs_c(lambda: newton_schulz_iterate(p, 20))
    with torch.no_grad():
        assert runs_c(lambda: newton_schulz_iterate(p.clone().requires_grad_(), 20))
    expected = real(p, 20, None, CHECK_EVERY)
    monkeypatch.setattr(ns_native.LIBRARY, "load", lambda: None)  # no C compiler, or LAPLACIANFORMER_NO_NATIVE=1
    assert not runs_c(lambda: newton_schulz_iterate(p, 20))
    torch.testing.assert_close(newton_schulz_iterate(p, 20), expected, rtol=1e-11, atol=1e-12)


def test_c_loop_is_disabled_by_environment(monkeypatch):
    monkeypatch.setenv("LAPLACIANFORMER_NO_NATIVE", "1")
    lib = CLibrary(ns_native._SRC, ns_native._signatures)
    assert lib.load() is None
    assert lib.error() == "disabled by LAPLACIANFORMER_NO_NATIVE"


@pytest.mark.filterwarnings("ignore::FutureWarning")  # torch.jit.trace is deprecated
def test_torch_compile_and_tracing_use_the_torch_loop(c_loop, monkeypatch):
    """Under torch.compile (one graph, no break) and torch.jit.trace the solve is the torch loop."""
    monkeypatch.setattr(ns_native, "newton_schulz_native", lambda *a, **k: pytest.fail("C loop under graph capture"))
    p = regularise(spd((2,), 6), 0.01)
    ref = newton_schulz_iterate_reference(p, 20)
    compiled = torch.compile(lambda x: newton_schulz_iterate(x, 20), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(p), ref, rtol=1e-12, atol=1e-12)
    traced = torch.jit.trace(lambda x: newton_schulz_iterate(x, 20), (p,), check_trace=False)
    torch.testing.assert_close(traced(p), ref, rtol=1e-12, atol=1e-12)
