"""Fused injective / inline normalisation (ops/injective.py) vs the autograd composite and the
materialised formula: values, gradients (gradcheck), block sizes, degenerate keys, dispatch."""

import pytest
import torch

import laplacianformer.ops.injective as injective
from laplacianformer import laplacian_attention
from laplacianformer.ops.normalization import normalize_dense, normalize_nystrom, normalize_nystrom_reference

FUSED = ["injective", "inline"]
BLOCKS = {"one block": 1 << 18, "block per group": 60, "row blocks": 7}


def factors(groups=(2, 3), n_q=11, n_k=11, m=5, e=4, requires_grad=False):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    c = torch.rand(*groups, n_q, m, generator=gen, dtype=torch.float64)
    b = torch.randn(*groups, n_k, m, generator=gen, dtype=torch.float64)
    v = torch.randn(*groups, n_k, e, generator=gen, dtype=torch.float64)
    return [t.requires_grad_(requires_grad) for t in (c, b, v)]


@pytest.fixture(params=list(BLOCKS), ids=list(BLOCKS))
def block_elements(request, monkeypatch):
    monkeypatch.setattr(injective, "BLOCK_ELEMENTS", BLOCKS[request.param])
    return BLOCKS[request.param]


@pytest.mark.parametrize("norm", FUSED)
@pytest.mark.parametrize("n_q,n_k", [(11, 11), (9, 13)])
def test_values_equal_composite_and_materialised_formula(norm, n_q, n_k, block_elements):
    c, b, v = factors(n_q=n_q, n_k=n_k)
    dense = normalize_dense(c @ b.transpose(-1, -2), v, norm)
    for grad in (False, True):
        args = [t.clone().requires_grad_(grad) for t in (c, b, v)]
        out = normalize_nystrom(*args, norm)
        assert out.shape == dense.shape
        torch.testing.assert_close(out, normalize_nystrom_reference(*args, norm), rtol=1e-8, atol=1e-10)
        torch.testing.assert_close(out, dense, rtol=1e-8, atol=1e-10)


@pytest.mark.parametrize("norm", FUSED)
def test_gradients_equal_composite(norm, block_elements):
    c, b, v = factors(n_q=10, n_k=12, requires_grad=True)
    probe = torch.randn(2, 3, 10, 4, dtype=torch.float64)
    fused = torch.autograd.grad(normalize_nystrom(c, b, v, norm), (c, b, v), probe)
    ref = torch.autograd.grad(normalize_nystrom_reference(c, b, v, norm), (c, b, v), probe)
    for name, a, r in zip("cbv", fused, ref):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")


@pytest.mark.parametrize("norm", FUSED)
def test_gradcheck(norm, block_elements):
    c, b, v = factors(groups=(2,), n_q=7, n_k=8, m=4, e=3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, b, v: normalize_nystrom(c, b, v, norm, 1e-3), (c, b, v))


def test_broadcast_leading_dimensions():
    c, b, v = factors(groups=(1, 3))
    b2 = b[:1, :1].expand(2, 3, -1, -1).clone()
    ref = normalize_nystrom_reference(c.expand(2, 3, -1, -1), b2, v[:1, :1].expand(2, 3, -1, -1), "injective")
    torch.testing.assert_close(normalize_nystrom(c, b2, v[:1, :1], "injective"), ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(normalize_nystrom(c[0], b[0], v[0], "injective"),
                               normalize_nystrom_reference(c[0], b[0], v[0], "injective"), rtol=1e-8, atol=1e-10)


def test_constant_key_column_gives_finite_output_and_reference_gradients():
    """b_j = b̄ for every key (all keys equal): s_j = 0, r_j = eps^-1/2; same values and gradients as the composite."""
    c, b, v = factors(groups=(1,), requires_grad=True)
    b_const = b[:, :1].detach().expand(-1, 11, -1).clone().requires_grad_()
    probe = torch.randn(1, 11, 4, dtype=torch.float64)
    outs = [f(c, b_const, v, "injective") for f in (normalize_nystrom, normalize_nystrom_reference)]
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-8, atol=1e-10)
    grads = [torch.autograd.grad(o, (c, b_const, v), probe) for o in outs]
    for a, r in zip(*grads):
        assert torch.isfinite(a).all()
        torch.testing.assert_close(a, r, rtol=1e-7, atol=1e-9)


@pytest.mark.parametrize("norm", FUSED)
def test_double_backward_raises(norm):
    c, b, v = factors(requires_grad=True)
    (g,) = torch.autograd.grad(normalize_nystrom(c, b, v, norm).square().sum(), c, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), v)


def _graph_names(out: torch.Tensor) -> set[str]:
    names, todo = set(), [out.grad_fn]
    while todo:
        fn = todo.pop()
        if fn is not None and type(fn).__name__ not in names:
            names.add(type(fn).__name__)
            todo.extend(f for f, _ in fn.next_functions)
    return names


def test_graph_capture_uses_composite(monkeypatch):
    c, b, v = factors(requires_grad=True)
    assert "InjectiveNormalizationBackward" in _graph_names(normalize_nystrom(c, b, v, "injective"))
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    assert "InjectiveNormalizationBackward" not in _graph_names(normalize_nystrom(c, b, v, "injective"))


def test_unknown_norm_names_the_argument():
    c, b, v = factors()
    with pytest.raises(ValueError, match="^norm: expected one of"):
        normalize_nystrom(c, b, v, "whiten")


@pytest.mark.parametrize("norm", FUSED)
def test_attention_gradcheck_end_to_end(norm):
    gen = torch.Generator().manual_seed(torch.seed() % 2**31)
    q, k, v = (torch.randn(1, 1, 9, 3, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))

    def f(q, k, v):
        return laplacian_attention(q, k, v, hw=(3, 3), landmarks=(2, 2), norm=norm, solver="exact", norm_eps=1e-3)

    assert torch.autograd.gradcheck(f, (q, k, v), fast_mode=True)
