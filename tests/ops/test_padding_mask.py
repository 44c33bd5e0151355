"""key_padding_mask of ``laplacian_attention`` (docs/DESIGN.md §2.5): a padded batch gives each real token what
its sequence gives alone, to float64 round-off, whatever the padding holds; padded inputs get zero gradient."""

import itertools

import pytest
import torch

from laplacianformer.ops import laplacian_attention, use
from laplacianformer.ops.pooling import adaptive_pool_matrix, masked_pool_matrix
from laplacianformer.ops.dispatch import BackendRefused, explain
from laplacianformer.ops.normalization import normalize_nystrom
from laplacianformer.ops.kernel_families import kernel_names

NORMS = ("injective", "inline", "rowsum", "none", "injective_nomean")
KERNELS = kernel_names()


def padded_batch(gen, lengths, n, heads=2, d=6, garbage=1e3, nan=False):
    """q, k, v (B, H, n, d) float64 whose padded positions hold garbage (large values, or NaN), and the mask."""
    mask = torch.arange(n)[None] >= torch.tensor(lengths)[:, None]
    out = []
    for _ in range(3):
        t = torch.randn(len(lengths), heads, n, d, generator=gen, dtype=torch.float64)
        junk = torch.full_like(t, float("nan")) if nan else garbage * torch.randn(t.shape, generator=gen, dtype=t.dtype)
        out.append(torch.where(mask[:, None, :, None], junk, t).requires_grad_(True))
    return (*out, mask)


def check_against_alone(q, k, v, mask, lengths, tol=1e-10, **kw):
    out = laplacian_attention(q, k, v, key_padding_mask=mask, **kw)
    weight = torch.randn(out.shape, generator=torch.Generator().manual_seed(7), dtype=out.dtype)
    grads = torch.autograd.grad((out * weight).sum(), (q, k, v))
    pad = mask[:, None, :, None].expand_as(out)
    assert torch.equal(out[pad], torch.zeros_like(out[pad]))
    for g in grads:
        assert torch.equal(g[pad], torch.zeros_like(g[pad])), "padded inputs must get zero gradient"
    for b, n_valid in enumerate(lengths):
        alone = [t[b : b + 1, :, :n_valid].detach().requires_grad_(True) for t in (q, k, v)]
        if k is q:  # tied keys stay tied
            alone[1] = alone[0]
        ref = laplacian_attention(*alone, **kw)
        ref_grads = torch.autograd.grad((ref * weight[b : b + 1, :, :n_valid]).sum(), alone)
        torch.testing.assert_close(out[b : b + 1, :, :n_valid], ref, rtol=tol, atol=tol)
        for g, r in zip(grads, ref_grads):
            torch.testing.assert_close(g[b : b + 1, :, :n_valid], r, rtol=tol, atol=tol)


# every norm with the paper's kernel, every other family with the default norm (the mask reaches the kernel
# rows and the normalisation's statistics independently)
NORM_KERNELS = [(norm, KERNELS[0]) for norm in NORMS] + [(NORMS[0], kernel) for kernel in KERNELS[1:]]


@pytest.mark.parametrize("norm,kernel,landmarks,reference", [
    pytest.param(norm, kernel, landmarks, reference, id="-".join(map(str, (norm, kernel, landmarks, reference))))
    for (norm, kernel), landmarks, reference in itertools.product(NORM_KERNELS, (None, 8), (False, True))
])
def test_padded_batch_matches_each_sequence_alone(seeded, norm, kernel, landmarks, reference):
    seed, gen = seeded
    lengths = [int(x) for x in torch.randint(9, 41, (3,), generator=gen)]
    lengths[0] = 40  # one unpadded sequence
    q, k, v, mask = padded_batch(gen, lengths, 40)
    with use(reference=reference):
        check_against_alone(q, k, v, mask, lengths, norm=norm, kernel=kernel, landmarks=landmarks)


def test_nan_padding_and_tied_keys(seeded):
    _, gen = seeded
    lengths = [30, 17]
    q, k, v, mask = padded_batch(gen, lengths, 30, nan=True)
    check_against_alone(q, k, v, mask, lengths, landmarks=6)
    check_against_alone(q, q, v, mask, lengths, landmarks=6, kernel="gaussian", norm="none")  # SOFT's tied form


def test_left_and_interior_padding_pool_the_valid_tokens_in_order(seeded):
    """Any mask: landmarks pool the valid tokens in order, as the compacted sequence alone."""
    _, gen = seeded
    n = 24
    mask = torch.zeros(2, n, dtype=torch.bool)
    mask[0, :5] = True
    mask[1, 7:12] = True
    q, k, v = (torch.randn(2, 1, n, 4, generator=gen, dtype=torch.float64) for _ in range(3))
    out = laplacian_attention(q, k, v, landmarks=5, key_padding_mask=mask)
    for b in range(2):
        keep = ~mask[b]
        ref = laplacian_attention(q[b : b + 1, :, keep], k[b : b + 1, :, keep], v[b : b + 1, :, keep], landmarks=5)
        torch.testing.assert_close(out[b : b + 1, :, keep], ref, rtol=1e-10, atol=1e-10)


def test_masked_pool_matrix_is_adaptive_pooling_of_the_valid_tokens():
    mask = torch.arange(20)[None] >= torch.tensor([20, 13, 4])[:, None]
    p = masked_pool_matrix(mask, 5, torch.float64)
    for b, n_valid in enumerate([20, 13, 4]):
        torch.testing.assert_close(p[b, :, :n_valid], adaptive_pool_matrix(n_valid, 5, torch.float64, torch.device("cpu")))
        assert not p[b, :, n_valid:].any()


def test_exact_kernel_on_a_2d_grid_takes_a_mask_pooled_landmarks_refuse_it():
    q = torch.randn(2, 1, 16, 4)
    mask = torch.zeros(2, 16, dtype=torch.bool)
    mask[1, 12:] = True
    assert laplacian_attention(q, q, q, hw=(4, 4), landmarks=None, key_padding_mask=mask).shape == q.shape
    with pytest.raises(ValueError, match="^key_padding_mask: not supported on a 2-D token grid with pooled landmarks"):
        laplacian_attention(q, q, q, hw=(4, 4), landmarks=(2, 2), key_padding_mask=mask)


def test_fused_normalization_refuses_a_mask_and_the_composite_serves_it():
    c, b, v = torch.rand(2, 1, 10, 3), torch.rand(2, 1, 10, 3), torch.randn(2, 1, 10, 4)
    mask = torch.zeros(2, 10, dtype=torch.bool)
    mask[0, 7:] = True
    text = explain("normalization", c, b, v, "injective", 1e-6, None, mask)
    assert "a key_padding_mask is not supported by the fused path" in text
    with use(normalization="fused"), pytest.raises(BackendRefused, match="key_padding_mask is not supported"):
        normalize_nystrom(c, b, v, "injective", key_padding_mask=mask)
    assert normalize_nystrom(c, b, v, "injective", key_padding_mask=mask).shape == (2, 1, 10, 4)


def test_mask_argument_errors():
    q = torch.randn(2, 1, 10, 4)
    with pytest.raises(TypeError, match="^key_padding_mask: expected dtype torch.bool"):
        laplacian_attention(q, q, q, landmarks=4, key_padding_mask=torch.zeros(2, 10))
    with pytest.raises(ValueError, match=r"^key_padding_mask: expected shape \(B, N\) = \(2, 10\)"):
        laplacian_attention(q, q, q, landmarks=4, key_padding_mask=torch.zeros(2, 9, dtype=torch.bool))
    full = torch.zeros(2, 10, dtype=torch.bool)
    full[1] = True
    with pytest.raises(ValueError, match="^key_padding_mask: a sequence is all padding"):
        laplacian_attention(q, q, q, landmarks=4, key_padding_mask=full)


@pytest.mark.parametrize("kwargs,name", [(dict(attn_mask=torch.ones(10, 10, dtype=torch.bool)), "attn_mask"),
                                         (dict(is_causal=True), "is_causal")])
def test_attn_mask_and_is_causal_are_rejected_with_the_reason(kwargs, name):
    q = torch.randn(1, 1, 10, 4)
    with pytest.raises(ValueError, match=f"^{name}: not supported: the pooled landmarks mix all positions"):
        laplacian_attention(q, q, q, landmarks=4, **kwargs)


def test_default_landmarks_on_a_sequence_are_49_in_operator_and_module():
    """One rule (``resolve_landmarks``): a (7, 7) grid on a 1-D sequence counts 49 landmarks."""
    q = torch.randn(1, 2, 100, 4, dtype=torch.float64)
    out, stats = laplacian_attention(q, q, q, return_stats=True)
    assert stats["landmarks"] == 49
    torch.testing.assert_close(out, laplacian_attention(q, q, q, landmarks=49))
