"""Prefix tokens of ``laplacian_attention`` (``num_prefix_tokens`` P, docs/DESIGN.md §2.7): the first P tokens
attend and are attended as every token, the landmarks pool the N - P grid tokens after them only. Values
against the formula built densely in float64 (landmarks pooled from the grid part by torch's own adaptive
pooling, ĝ = C_q (W + εI)⁻¹ C_kᵀ over all N tokens, the reference normalisation), gradients by gradcheck,
the lean recompute against the plain operator, key padding masks, the landmark clamp, the errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from laplacianformer.ops import laplacian_attention, laplacian_attention_recompute, use
from laplacianformer.ops.kernel import laplace_kernel_naive
from laplacianformer.ops.normalization import normalize_dense
from laplacianformer.ops.kernel_families import kernel_names

NORMS = ("injective", "inline", "rowsum", "none", "injective_nomean")


def draw(gen, b=2, h=2, n=25, d=6, e=5):
    make = lambda width: torch.randn(b, h, n, width, generator=gen, dtype=torch.float64)
    return make(d), make(d), make(e)


def dense_reference(q, k, v, prefix, hw, landmarks, norm, kernel="laplacian", lam=4.0, scale=1.0, eps=0.01):
    """Z(C_q (W + εI)⁻¹ C_kᵀ) V with every matrix materialised; the landmarks are torch's adaptive average pooling
    of the scaled grid queries q[:, :, prefix:] (2-D on ``hw``, 1-D when hw is None)."""
    q, k = q * scale, k * scale
    b, h, n, d = q.shape
    grid = q[:, :, prefix:].reshape(b * h, n - prefix, d).transpose(1, 2)
    if hw is None:
        marks = F.adaptive_avg_pool1d(grid, landmarks)
    else:
        marks = F.adaptive_avg_pool2d(grid.reshape(b * h, d, *hw), landmarks).flatten(2)
    marks = marks.transpose(1, 2).reshape(b, h, -1, d)
    w = laplace_kernel_naive(marks, marks, lam, kernel)
    w_inv = torch.linalg.inv(w + eps * torch.eye(w.shape[-1], dtype=w.dtype))
    c_q, c_k = laplace_kernel_naive(q, marks, lam, kernel), laplace_kernel_naive(k, marks, lam, kernel)
    g = c_q @ w_inv @ c_k.transpose(-1, -2)
    return normalize_dense(g, v, norm)


@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("prefix,hw,landmarks", [(1, (4, 6), (2, 3)), (3, (4, 6), (3, 4)), (2, None, 5)],
                         ids=["cls-2d", "cls+2reg-2d", "prefix-1d"])
def test_nystrom_with_prefix_equals_dense_formula(seeded, norm, prefix, hw, landmarks):
    _, gen = seeded
    q, k, v = draw(gen, n=prefix + 24)
    out = laplacian_attention(q, k, v, hw=hw, num_prefix_tokens=prefix, landmarks=landmarks, norm=norm,
                              solver="exact", norm_scale="one")  # the unscaled formula of the reference
    ref = dense_reference(q, k, v, prefix, hw, landmarks, norm, scale=q.shape[-1] ** -0.5)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("kernel", kernel_names())
def test_tied_keys_and_converged_newton_schulz(seeded, kernel):
    """K = Q (one tensor) and the default solver, run to convergence, against the dense formula."""
    _, gen = seeded
    q, _, v = draw(gen, n=1 + 24)
    out = laplacian_attention(q, q, v, hw=(4, 6), num_prefix_tokens=1, landmarks=(2, 2), kernel=kernel, lam=4.0,
                              qk_scale=0.5, iters=60, norm_scale="one")
    ref = dense_reference(q, q, v, 1, (4, 6), (2, 2), "injective", kernel=kernel, scale=0.5)
    torch.testing.assert_close(out, ref, rtol=1e-7, atol=1e-9)


def test_the_prefix_tokens_are_not_pooled(seeded):
    """The landmarks come from the grid tokens only: changing a prefix token's query leaves them as they are
    (so a 1-token grid with prefix tokens gives W = k(L, L) from that token alone), and the prefix tokens are
    not the first grid row: the result differs from calling it without prefix tokens on a grid over all N."""
    _, gen = seeded
    q, k, v = draw(gen, n=2 + 16)
    stats = laplacian_attention(q, k, v, hw=(4, 4), num_prefix_tokens=2, landmarks=(2, 2), return_stats=True)[1]
    q2 = q.clone()
    q2[:, :, :2] += 3.0
    stats2 = laplacian_attention(q2, k, v, hw=(4, 4), num_prefix_tokens=2, landmarks=(2, 2), return_stats=True)[1]
    torch.testing.assert_close(stats["residual"], stats2["residual"], rtol=0, atol=0)
    assert stats["landmarks"] == 4
    plain = laplacian_attention(q, k, v, hw=(3, 6), landmarks=(2, 2))
    assert not torch.allclose(plain, laplacian_attention(q, k, v, hw=(4, 4), num_prefix_tokens=2, landmarks=(2, 2)))


@pytest.mark.parametrize("norm", NORMS)
def test_gradcheck(norm):
    gen = torch.Generator().manual_seed(3)
    q, k, v = (t.requires_grad_(True) for t in draw(gen, b=1, h=1, n=2 + 6, d=3, e=2))
    fn = lambda q, k, v: laplacian_attention(q, k, v, hw=(2, 3), num_prefix_tokens=2, landmarks=(1, 2), norm=norm,
                                             solver="exact")
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_gradcheck_1d_with_mask_and_gaussian():
    gen = torch.Generator().manual_seed(4)
    q, k, v = (t.requires_grad_(True) for t in draw(gen, b=2, h=1, n=1 + 7, d=3, e=2))
    mask = torch.zeros(2, 8, dtype=torch.bool)
    mask[1, 6:] = True
    fn = lambda q, k, v: laplacian_attention(q, k, v, num_prefix_tokens=1, landmarks=3, kernel="gaussian",
                                             solver="exact", key_padding_mask=mask)
    assert torch.autograd.gradcheck(fn, (q, k, v), eps=1e-6, atol=1e-7, rtol=1e-5)


def test_zero_prefix_is_the_call_without_it(seeded):
    """P = 0 runs what the call without ``num_prefix_tokens`` runs, bit for bit, values and gradients."""
    _, gen = seeded
    q, k, v = (t.requires_grad_(True) for t in draw(gen, n=24))
    for kw in (dict(hw=(4, 6), landmarks=(2, 3)), dict(landmarks=5), dict(hw=(4, 6), landmarks=None)):
        a = laplacian_attention(q, k, v, **kw)
        b = laplacian_attention(q, k, v, num_prefix_tokens=0, **kw)
        assert torch.equal(a, b)
        for ga, gb in zip(torch.autograd.grad(a.sum(), (q, k, v)), torch.autograd.grad(b.sum(), (q, k, v))):
            assert torch.equal(ga, gb)


def test_landmark_clamp_counts_the_grid_tokens(seeded):
    """``resolve_landmarks`` sees the N - P grid tokens: landmarks covering the grid give the exact kernel, which
    ignores P; fewer give the Nyström path over all N tokens."""
    _, gen = seeded
    q, k, v = draw(gen, n=1 + 9)
    exact = laplacian_attention(q, k, v, landmarks=None)
    assert torch.equal(laplacian_attention(q, k, v, hw=(3, 3), num_prefix_tokens=1, landmarks=(7, 7)), exact)
    assert torch.equal(laplacian_attention(q, k, v, hw=(3, 3), num_prefix_tokens=1, landmarks=None), exact)
    assert torch.equal(laplacian_attention(q, k, v, num_prefix_tokens=1, landmarks=9), exact)
    _, stats = laplacian_attention(q, k, v, num_prefix_tokens=1, landmarks=8, return_stats=True)
    assert stats["landmarks"] == 8


@pytest.mark.parametrize("norm", ["injective", "rowsum"])
def test_masked_batch_with_prefix_matches_each_sequence_alone(seeded, norm):
    """1-D landmarks pool the valid tokens after the prefix (docs/DESIGN.md §2.5, §2.7); the exact kernel takes
    a mask on a grid with prefix tokens too."""
    _, gen = seeded
    lengths = [1 + 30, 1 + 19, 1 + 12]
    q, k, v = (t.requires_grad_(True) for t in draw(gen, b=3, n=31))
    mask = torch.arange(31)[None] >= torch.tensor(lengths)[:, None]
    kw = dict(num_prefix_tokens=1, landmarks=6, norm=norm)
    out = laplacian_attention(q, k, v, key_padding_mask=mask, **kw)
    probe = torch.randn(out.shape, generator=gen, dtype=out.dtype)
    grads = torch.autograd.grad((out * probe).sum(), (q, k, v))
    for i, n in enumerate(lengths):
        alone = [t[i : i + 1, :, :n].detach().requires_grad_(True) for t in (q, k, v)]
        ref = laplacian_attention(*alone, **kw)
        torch.testing.assert_close(out[i : i + 1, :, :n], ref, rtol=1e-10, atol=1e-10)
        ref_grads = torch.autograd.grad((ref * probe[i : i + 1, :, :n]).sum(), alone)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g[i : i + 1, :, :n], r, rtol=1e-10, atol=1e-10)
        assert torch.equal(out[i, :, n:], torch.zeros_like(out[i, :, n:]))
    grid_mask = torch.zeros(3, 1 + 16, dtype=torch.bool)
    grid_mask[1, 0] = True  # a padded prefix token
    grid_mask[2, 10:] = True
    q, k, v = draw(gen, b=3, n=17)
    out = laplacian_attention(q, k, v, hw=(4, 4), num_prefix_tokens=1, landmarks=None, key_padding_mask=grid_mask)
    assert torch.equal(out, laplacian_attention(q, k, v, landmarks=None, key_padding_mask=grid_mask))


def test_lean_recompute_with_prefix_equals_plain(seeded):
    _, gen = seeded
    b, n, c, heads = 2, 2 + 25, 12, 2
    x = torch.randn(b, n, c, generator=gen, dtype=torch.float64, requires_grad=True)
    v = torch.randn(b, heads, n, c // heads, generator=gen, dtype=torch.float64, requires_grad=True)
    wq, wk = (torch.randn(c, c, generator=gen, dtype=torch.float64).div(c**0.5).requires_grad_() for _ in range(2))
    bq = torch.randn(c, generator=gen, dtype=torch.float64, requires_grad=True)
    for mask_kw in (dict(hw=(5, 5), landmarks=(2, 3)),
                    dict(landmarks=4, key_padding_mask=torch.arange(n)[None] >= torch.tensor([[n], [n - 6]]))):
        lean = laplacian_attention_recompute(x, v, wq, bq, wk, None, num_heads=heads, num_prefix_tokens=2, **mask_kw)
        q = F.linear(x, wq, bq).view(b, n, heads, -1).transpose(1, 2)
        k = F.linear(x, wk).view(b, n, heads, -1).transpose(1, 2)
        plain = laplacian_attention(q, k, v, num_prefix_tokens=2, **mask_kw)
        torch.testing.assert_close(lean, plain, rtol=1e-10, atol=1e-10)
        probe = torch.randn(lean.shape, generator=gen, dtype=lean.dtype)
        leaves = (x, v, wq, bq, wk)
        for a, r in zip(torch.autograd.grad(lean, leaves, probe), torch.autograd.grad(plain, leaves, probe)):
            torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-10)


def test_reference_backends_serve_prefix_tokens(seeded):
    """The landmarks of the grid part go through the op ``pooling`` like any others: its reference backend and
    the reference mode of every op give the same values."""
    _, gen = seeded
    q, k, v = draw(gen, n=1 + 24)
    out = laplacian_attention(q, k, v, hw=(4, 6), num_prefix_tokens=1, landmarks=(2, 3))
    with use(pooling="adaptive_avg_pool"):
        torch.testing.assert_close(laplacian_attention(q, k, v, hw=(4, 6), num_prefix_tokens=1, landmarks=(2, 3)),
                                   out, rtol=1e-12, atol=1e-12)
    with use(reference=True):
        torch.testing.assert_close(laplacian_attention(q, k, v, hw=(4, 6), num_prefix_tokens=1, landmarks=(2, 3)),
                                   out, rtol=1e-9, atol=1e-10)


def test_errors():
    q = torch.randn(2, 1, 1 + 24, 4)
    cases = [
        (dict(hw=(4, 6), num_prefix_tokens=-1), ValueError, "num_prefix_tokens: expected an int >= 0"),
        (dict(num_prefix_tokens=25), ValueError, "num_prefix_tokens: expected fewer than the N = 25"),
        (dict(hw=(4, 6), num_prefix_tokens=1.0), TypeError, "num_prefix_tokens: expected an int"),
        (dict(hw=(4, 6), num_prefix_tokens=True), TypeError, "num_prefix_tokens: expected an int"),
        (dict(hw=(4, 6), num_prefix_tokens=2), ValueError, r"hw: expected height \* width == N - num_prefix_tokens "
                                                           r"= 25 - 2 = 23"),
        (dict(hw=(4, 6)), ValueError, r"hw: expected height \* width == N = 25"),
        (dict(hw=(2, 12), num_prefix_tokens=1, landmarks=8), ValueError, "landmarks: with a 2-D grid an int must"),
    ]
    for kw, exc, match in cases:
        with pytest.raises(exc, match=match):
            laplacian_attention(q, q, q, **kw)
    mask = torch.zeros(2, 25, dtype=torch.bool)
    with pytest.raises(ValueError, match="key_padding_mask: not supported on a 2-D token grid"):
        laplacian_attention(q, q, q, hw=(4, 6), num_prefix_tokens=1, key_padding_mask=mask, landmarks=(2, 2))
    mask[1, 1:] = True  # only the prefix token is valid: nothing to pool
    with pytest.raises(ValueError, match="key_padding_mask: a sequence has no valid token after its num_prefix_tokens"):
        laplacian_attention(q, q, q, num_prefix_tokens=1, key_padding_mask=mask, landmarks=4)
    exact = laplacian_attention(q, q, q, num_prefix_tokens=1, key_padding_mask=mask, landmarks=None)
    assert torch.isfinite(exact).all()
    x = torch.randn(2, 25, 8)
    with pytest.raises(ValueError, match="num_prefix_tokens: expected fewer"):
        laplacian_attention_recompute(x, torch.randn(2, 2, 25, 4), torch.randn(8, 8), num_heads=2, num_prefix_tokens=25)
