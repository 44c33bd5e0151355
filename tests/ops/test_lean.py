"""The lean host path of CPU inference (``ops/lean.py``, docs/DESIGN.md §6.6): a layer's later calls of a call
signature equal its first (general-path) call bit for bit; signatures whose general call took other backends,
forced backends, recordings and other dtypes keep the general path."""

from __future__ import annotations

import copy
import pickle

import pytest
import torch

from laplacianformer import LaplacianAttention
from laplacianformer.ops import explain_all, use
from laplacianformer.ops.kernel import native
from laplacianformer.ops.kernel_families import code_path_representatives, kernel_spec
from laplacianformer.ops.lean import LeanNystrom

pytestmark = pytest.mark.skipif(native.load() is None, reason="C loops unavailable")
THREADS = torch.get_num_threads()


def _layer(dim=32, heads=2, **kw):
    torch.manual_seed(0)
    return LaplacianAttention(dim, heads, **kw).eval()


def _twice(layer, x, hw):
    """(first call: the general path and the plan made; second call: the plan's path)."""
    with torch.no_grad():
        return layer(x, hw), layer(x, hw)


@pytest.mark.parametrize("kernel", code_path_representatives())
@pytest.mark.parametrize("case", ["grid-h2", "grid-h1-b2", "tied", "1d", "inline", "float64", "rect-grid",
                                  "exact", "exact-small-grid", "exact-inline"])
def test_lean_calls_equal_the_general_call_bit_for_bit(kernel, case, seeded):
    seed, gen = seeded
    dim, heads, b, hw, kw, dtype = 32, 2, 1, (12, 10), {}, torch.float32
    if case == "grid-h1-b2":
        heads, b = 1, 2
    elif case == "tied":
        kw = dict(tie_qk=True)
    elif case == "1d":
        hw = None
    elif case == "inline":
        kw = dict(norm="inline")
    elif case == "float64":
        dtype = torch.float64
    elif case == "rect-grid":
        hw, kw = (9, 17), dict(landmarks=(3, 5))
    elif case == "exact":  # no landmarks: the exact kernel at any size
        kw = dict(landmarks=None)
    elif case == "exact-small-grid":  # the landmarks would cover every token (§2.2): the exact kernel
        hw = (5, 6)
    elif case == "exact-inline":
        hw, kw = (4, 4), dict(norm="inline", tie_qk=True)
    layer = _layer(dim, heads, kernel=kernel, **kw).to(dtype)
    n = 120 if hw is None else hw[0] * hw[1]
    x = torch.randn(b, n, dim, generator=gen, dtype=dtype)
    first, second = _twice(layer, x, hw)
    plans = list(layer._lean_calls.values())
    assert plans != [False], f"seed {seed}: the lean path was not planned ({case})"
    bound = not case.startswith("exact") and kernel_spec(kernel).exp_of_accumulation
    assert isinstance(plans[0], LeanNystrom) == bound, (case, kernel, plans)  # the C calls made by the plan
    assert torch.equal(first, second), f"seed {seed}: lean differs from the general path ({kernel}, {case})"
    with torch.no_grad():
        torch.set_num_threads(1)
        try:
            assert torch.equal(layer(x, hw), first), "the thread count changed the lean result"
        finally:
            torch.set_num_threads(THREADS)


def test_a_changed_conv_weight_reaches_the_lean_path(seeded):
    """The bound line keeps the conv's taps only while the weight is the same tensor at the same version: after
    an in-place update (an optimizer step) or a new weight tensor, its calls equal a copy's first (general)
    call. Copies and pickles start with no plans (a plan holds this process's C entry points)."""
    _, gen = seeded
    layer = _layer()
    x = torch.randn(1, 100, 32, generator=gen)
    _twice(layer, x, (10, 10))
    assert isinstance(next(iter(layer._lean_calls.values())), LeanNystrom)
    with torch.no_grad():
        for change in ("in place", "new tensor"):
            if change == "in place":
                layer.dwconv.weight.mul_(2.0)
            else:
                layer.dwconv.weight = torch.nn.Parameter(layer.dwconv.weight * 0.5 + 0.1)
            fresh = copy.deepcopy(layer)
            assert fresh._lean_calls == {}
            assert torch.equal(layer(x, (10, 10)), fresh(x, (10, 10))), change
    assert pickle.loads(pickle.dumps(layer))._lean_calls == {}


def test_signatures_the_lean_path_does_not_reproduce_keep_the_general_path(seeded):
    _, gen = seeded
    x = torch.randn(1, 100, 32, generator=gen)
    for kw in (dict(norm="rowsum"), dict(norm="none"), dict(solver="cg"), dict(norm_scale="learned"),
               dict(landmarks=None, norm="rowsum")):
        layer = _layer(**kw)
        first, second = _twice(layer, x, (10, 10))
        assert all(v is False for v in layer._lean_calls.values()), kw
        assert torch.equal(first, second), kw


def test_forced_backends_and_recordings_take_the_general_path(seeded):
    _, gen = seeded
    layer = _layer()
    x = torch.randn(1, 100, 32, generator=gen)
    lean = _twice(layer, x, (10, 10))[1]
    with use(normalization="composite"), torch.no_grad():
        forced = layer(x, (10, 10))
        assert layer(x, (10, 10)).equal(forced)
    assert sum(v is False for v in layer._lean_calls.values()) == 1  # the forced signature is planned apart
    torch.testing.assert_close(forced, lean, rtol=1e-5, atol=1e-5)
    q = torch.randn(1, 2, 100, 16, generator=gen)
    report = explain_all(q, q, q, hw=(10, 10))
    assert "normalization: selection 'auto' runs 'cpu'" in report  # recordings still see every dispatch


def test_autograd_calls_never_plan(seeded):
    _, gen = seeded
    layer = _layer().train()
    x = torch.randn(1, 100, 32, generator=gen, requires_grad=True)
    layer(x, (10, 10)).sum().backward()
    assert layer._lean_calls == {} and x.grad is not None
