"""Fused injective / inline normalisation (ops/normalization/fused.py, backend ``fused``; the C backend, which "auto"
runs first on CPU, is switched off here and tested in test_normalization_native.py) vs the autograd composite and the
materialised formula: values, gradients (gradcheck), block sizes, degenerate keys, dispatch."""

import pytest
import torch

import laplacianformer.ops.normalization.fused as injective
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


@pytest.fixture(autouse=True)
def fused_backend(monkeypatch):
    """"auto" passes over the C backend in this file, so the PyTorch ``fused`` backend runs where it serves."""
    from laplacianformer.ops.normalization import cpu as normalization_cpu

    monkeypatch.setattr(normalization_cpu, "available", lambda: False)


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


# --- W-form: normalize_nystrom(c_q, c_k, v, norm, w_inv=W⁺) takes C_k and W⁺ instead of B = C_k W⁺ᵀ ---


def landmark_factors(groups=(2, 3), n_q=11, n_k=11, m=5, e=4, requires_grad=False):
    c, c_k, v = factors(groups, n_q, n_k, m, e)
    w = torch.randn(*groups, m, m, generator=torch.Generator().manual_seed(torch.seed() % 2**31), dtype=torch.float64)
    return [t.requires_grad_(requires_grad) for t in (c, c_k, w, v)]


@pytest.mark.parametrize("norm", ["injective", "inline", "rowsum", "none", "injective_nomean"])
@pytest.mark.parametrize("n_q,n_k", [(11, 11), (9, 13)])
def test_w_inv_form_equals_composite_of_b(norm, n_q, n_k, block_elements):
    """Values and gradients for (c, c_k, W⁺, v) equal the composite applied to B = C_k W⁺ᵀ."""
    c, c_k, w, v = landmark_factors(n_q=n_q, n_k=n_k, requires_grad=True)
    probe = torch.randn(2, 3, n_q, 4, dtype=torch.float64)
    out = normalize_nystrom(c, c_k, v, norm, w_inv=w)
    ref = normalize_nystrom_reference(c, c_k @ w.transpose(-1, -2), v, norm)
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    fused = torch.autograd.grad(out, (c, c_k, w, v), probe)
    composite = torch.autograd.grad(ref, (c, c_k, w, v), probe)
    for name, a, r in zip(("c", "c_k", "w_inv", "v"), fused, composite):
        torch.testing.assert_close(a, r, rtol=1e-8, atol=1e-10, msg=lambda m: f"d{name}: {m}")
    with torch.no_grad():
        torch.testing.assert_close(normalize_nystrom(c, c_k, v, norm, w_inv=w), ref, rtol=1e-8, atol=1e-10)


def test_w_inv_form_gradcheck(block_elements):
    c, c_k, w, v = landmark_factors(groups=(2,), n_q=7, n_k=8, m=4, e=3, requires_grad=True)
    assert torch.autograd.gradcheck(lambda c, c_k, w, v: normalize_nystrom(c, c_k, v, "injective", 1e-3, w_inv=w),
                                    (c, c_k, w, v))


def test_w_inv_form_broadcasts_and_double_backward_raises():
    c, c_k, w, v = landmark_factors(groups=(2, 3), requires_grad=True)
    w1 = w[:1].detach().clone().requires_grad_()
    out = normalize_nystrom(c, c_k, v, "injective", w_inv=w1)
    ref = normalize_nystrom_reference(c, c_k @ w1.transpose(-1, -2), v, "injective")
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(torch.autograd.grad(out.sum(), w1)[0], torch.autograd.grad(ref.sum(), w1)[0],
                               rtol=1e-8, atol=1e-10)
    (g,) = torch.autograd.grad(normalize_nystrom(c, c_k, v, "injective", w_inv=w).square().sum(), w, create_graph=True)
    with pytest.raises(RuntimeError):
        torch.autograd.grad(g.sum(), v)


def test_w_inv_form_graph_capture_uses_composite(monkeypatch):
    c, c_k, w, v = landmark_factors(requires_grad=True)
    assert "InjectiveNormalizationBackward" in _graph_names(normalize_nystrom(c, c_k, v, "injective", w_inv=w))
    monkeypatch.setattr(torch.onnx, "is_in_onnx_export", lambda: True)
    out = normalize_nystrom(c, c_k, v, "injective", w_inv=w)
    assert "InjectiveNormalizationBackward" not in _graph_names(out)
    torch.testing.assert_close(out, normalize_nystrom_reference(c, c_k @ w.transpose(-1, -2), v, "injective"))


@pytest.mark.parametrize("with_w", [False, True], ids=["b", "w_inv"])
def test_float32_covariance_of_nearly_constant_queries(with_w, block_elements):
    """c = const + tiny noise: the covariance comes from shifted data, not E[ccᵀ] − c̄c̄ᵀ, so float32 stays
    as close to the float64 result as the float32 composite (raw moments would lose ~8% here)."""
    gen = torch.Generator().manual_seed(0)
    c = 0.7 + 1e-3 * torch.rand(2, 3000, 6, generator=gen, dtype=torch.float64)
    c_k = torch.rand(2, 3000, 6, generator=gen, dtype=torch.float64)
    w = torch.randn(2, 6, 6, generator=gen, dtype=torch.float64)
    v = torch.randn(2, 3000, 5, generator=gen, dtype=torch.float64)
    ref = normalize_nystrom_reference(c, c_k @ w.transpose(-1, -2), v, "injective")
    c32, c_k32, w32, v32 = (t.float() for t in (c, c_k, w, v))
    if with_w:
        out = normalize_nystrom(c32, c_k32, v32, "injective", w_inv=w32)
    else:
        out = normalize_nystrom(c32, c_k32 @ w32.transpose(-1, -2), v32, "injective")
    composite = normalize_nystrom_reference(c32, c_k32 @ w32.transpose(-1, -2), v32, "injective")

    b = c_k32 @ w32.transpose(-1, -2)
    b_t = b - b.mean(-2, keepdim=True)
    c_mean = c32.mean(-2, keepdim=True)
    raw_cov = c32.transpose(-1, -2) @ c32 / c32.shape[-2] - c_mean.transpose(-1, -2) @ c_mean
    raw_var = ((b_t @ raw_cov) * b_t).sum(-1, keepdim=True).clamp_min(0.0)
    raw = (c32 - c_mean) @ ((b_t * torch.rsqrt(raw_var + 1e-6)).transpose(-1, -2) @ v32) + v32.mean(-2, keepdim=True)

    def rel(x):
        return ((x.double() - ref).norm() / ref.norm()).item()

    assert rel(out) < 1e-3
    assert rel(out) <= 2 * rel(composite)
    assert rel(raw) > 10 * rel(out)  # the test can tell: E[ccᵀ] − c̄c̄ᵀ in float32 fails it


def test_w_inv_form_empty_inputs():
    c, c_k, w, v = landmark_factors(groups=(2,), n_q=0, n_k=0)
    assert normalize_nystrom(c, c_k, v, "injective", w_inv=w).shape == (2, 0, 4)
    c, c_k, w, v = landmark_factors(groups=(2,), e=0)
    assert normalize_nystrom(c, c_k, v, "injective", w_inv=w).shape == (2, 11, 0)


@pytest.mark.parametrize("norm", FUSED)
@pytest.mark.parametrize("tied", [False, True], ids=["q!=k", "k is q"])
def test_attention_fused_equals_composite_normalization(norm, tied):
    """laplacian_attention (Newton–Schulz, implicit backward: dW⁺ flows from the fused op into the solver)
    gives the same values and gradients with the fused normalisation as with the composite."""
    from laplacianformer.ops import use

    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64, requires_grad=True) for _ in range(3))
    probe = torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64)

    def run():
        out = laplacian_attention(q, q if tied else k, v, hw=(6, 6), landmarks=(3, 3), norm=norm)
        return out, torch.autograd.grad(out, (q, v) if tied else (q, k, v), probe)

    out, grads = run()
    with use(normalization="composite"):
        ref, ref_grads = run()
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    for a, r in zip(grads, ref_grads):
        torch.testing.assert_close(a, r, rtol=1e-7, atol=1e-9)


def test_kept_scratch_works_across_inference_mode_and_training(block_elements):
    """The CPU scratch kept between calls (injective._WORKSPACE) is made outside inference mode, so a call
    under torch.inference_mode() does not break later training calls, and results do not depend on it."""
    c, c_k, w, v = landmark_factors(groups=(2,), n_q=9, n_k=13)
    injective._WORKSPACE.__dict__.clear()
    with torch.inference_mode():
        first = normalize_nystrom(c, c_k, v, "injective", w_inv=w)
    c.requires_grad_()
    out = normalize_nystrom(c, c_k, v, "injective", w_inv=w)
    (d_c,) = torch.autograd.grad(out.sum(), c)
    ref = normalize_nystrom_reference(c, c_k @ w.transpose(-1, -2), v, "injective")
    torch.testing.assert_close(out, ref, rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(first, ref.detach(), rtol=1e-8, atol=1e-10)
    torch.testing.assert_close(d_c, torch.autograd.grad(ref.sum(), c)[0], rtol=1e-8, atol=1e-10)
    with torch.inference_mode():
        torch.testing.assert_close(normalize_nystrom(c, c_k, v, "injective", w_inv=w), ref.detach(),
                                   rtol=1e-8, atol=1e-10)


# --- "injective_nomean": the injective map without subtracting the key mean mu_j (docs/DESIGN.md §4.4) ---


def test_injective_nomean_equals_the_formula_written_out():
    """z_ij = h_ij / sqrt(s_j² + eps) + 1/N with h_ij = ĝ_ij − mean_j ĝ_ij and s_j² = var_i h_ij (population),
    element by element in float64, against the dense and the factor forms."""
    c, b, v = factors(groups=(1,), n_q=6, n_k=7, m=3, e=2)
    g = (c @ b.transpose(-1, -2))[0]
    n_q, n_k = g.shape
    eps = 1e-6
    h = [[g[i, j].item() - sum(g[i, jj].item() for jj in range(n_k)) / n_k for j in range(n_k)] for i in range(n_q)]
    var = []
    for j in range(n_k):
        mean = sum(h[i][j] for i in range(n_q)) / n_q
        var.append(sum((h[i][j] - mean) ** 2 for i in range(n_q)) / n_q)
    z = torch.tensor([[h[i][j] / (var[j] + eps) ** 0.5 + 1.0 / n_k for j in range(n_k)] for i in range(n_q)],
                     dtype=torch.float64)
    expected = z @ v[0]
    torch.testing.assert_close(normalize_dense(g[None], v, "injective_nomean", eps)[0], expected, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(normalize_nystrom(c, b, v, "injective_nomean", eps)[0], expected, rtol=1e-10, atol=1e-12)
    # it differs from "injective" by the query-side mean: out − out_injective = c̄ M for every row
    diff = normalize_nystrom(c, b, v, "injective_nomean", eps) - normalize_nystrom(c, b, v, "injective", eps)
    torch.testing.assert_close(diff, diff[..., :1, :].expand_as(diff), rtol=1e-10, atol=1e-12)
    assert diff.abs().max() > 1e-6


def test_injective_nomean_runs_the_composite_with_a_reason():
    from laplacianformer import ops

    c, b, v = factors(groups=(2,), n_q=8, n_k=8, m=3, e=2)
    text = ops.explain("normalization", c, b, v, "injective_nomean", 1e-6, None)
    assert "composite" in text and "no fused form" in text
    assert torch.autograd.gradcheck(lambda c_, b_, v_: normalize_nystrom(c_, b_, v_, "injective_nomean", 1e-3),
                                    [t.clone().requires_grad_() for t in (c, b, v)])


def test_injective_nomean_needs_positive_eps():
    q = torch.randn(1, 1, 16, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="norm_eps"):
        laplacian_attention(q, q, q, hw=(4, 4), landmarks=(2, 2), norm="injective_nomean", norm_eps=0.0)
