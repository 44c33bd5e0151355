import pytest
import torch

from laplacianformer.baselines import (
    PerformerAttention,
    favor_features,
    orthogonal_random_features,
    performer_attention,
    performer_attention_dense,
)


def _features(m, d, seed):
    return orthogonal_random_features(m, d, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def _rel(a, b):
    return ((a - b).norm() / b.norm()).item()


def test_converges_to_softmax_attention(randn):
    # Measured (5 seeds): relative error 0.09-0.18 at M = 64, 0.009-0.012 at M = 16384.
    q, k = randn(2, 2, 16, 8, scale=0.5), randn(2, 2, 16, 8, scale=0.5)
    v = randn(2, 2, 16, 8)
    ref = performer_attention_dense(q, k, v)
    few = [_rel(performer_attention(q, k, v, _features(64, 8, s)), ref) for s in range(3)]
    many = [_rel(performer_attention(q, k, v, _features(16384, 8, s)), ref) for s in range(3)]
    assert max(many) < 0.03
    assert min(few) > 4 * max(many)


def test_orthogonal_blocks_and_gaussian_lengths():
    w = _features(40, 16, 0)
    for start in (0, 16):
        block = w[start : start + 16]
        dirs = block / block.norm(dim=1, keepdim=True)
        torch.testing.assert_close(dirs @ dirs.T, torch.eye(16, dtype=torch.float64), atol=1e-12, rtol=0)
    assert w.shape == (40, 16)
    assert 2.0 < w.norm(dim=1).mean() < 6.0


def test_stabiliser_cancels_exactly(randn):
    q, k, v = randn(2, 2, 9, 4, scale=2.0), randn(2, 2, 9, 4, scale=2.0), randn(2, 2, 9, 3)
    w = _features(32, 4, 3)
    root = 4**-0.25
    plain_q = torch.exp((q * root) @ w.T - 0.5 * (q * root).pow(2).sum(-1, keepdim=True))
    plain_k = torch.exp((k * root) @ w.T - 0.5 * (k * root).pow(2).sum(-1, keepdim=True))
    attn = plain_q @ plain_k.transpose(-1, -2)
    ref = attn @ v / attn.sum(-1, keepdim=True)
    torch.testing.assert_close(performer_attention(q, k, v, w), ref, rtol=1e-10, atol=1e-12)


def test_large_inputs_stay_finite_and_batch_independent(randn):
    q, k, v = (randn(2, 1, 10, 8, dtype=torch.float32) for _ in range(3))
    q[1] *= 20.0
    k[1] *= 20.0
    w = _features(64, 8, 0).float()
    root = 8**-0.25
    assert not torch.isfinite(torch.exp((q[1] * root) @ w.T)).all()
    out = performer_attention(q, k, v, w)
    assert torch.isfinite(out).all()
    alone = performer_attention(q[:1], k[:1], v[:1], w)
    torch.testing.assert_close(out[:1], alone, rtol=1e-6, atol=1e-6)


def test_gradcheck(randn):
    q, k, v = (randn(1, 2, 5, 4, scale=0.5).requires_grad_() for _ in range(3))
    w = _features(12, 4, 0)
    assert torch.autograd.gradcheck(lambda a, b, c: performer_attention(a, b, c, w), (q, k, v))


def test_features_positive(randn):
    x = randn(1, 1, 6, 4, scale=3.0)
    phi = favor_features(x, _features(8, 4, 0), is_query=False)
    assert (phi > 0).all() and phi.shape == (1, 1, 6, 8)


def test_module_redraw_and_state_dict():
    a = PerformerAttention(16, 2, num_features=24, seed=5)
    b = PerformerAttention(16, 2, num_features=24, seed=5)
    torch.testing.assert_close(a.projection, b.projection, rtol=0, atol=0)
    assert "projection" in a.state_dict()
    before = a.projection.clone()
    ptr = a.projection.data_ptr()
    a.redraw_features(seed=9)
    assert a.projection.data_ptr() == ptr
    assert not torch.equal(a.projection, before)
    a.redraw_features(seed=5)
    torch.testing.assert_close(a.projection, before, rtol=0, atol=0)


def test_performer_validation(randn):
    q = randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="^projection:"):
        performer_attention(q, q, q, _features(8, 3, 0))
    with pytest.raises(ValueError, match="^num_features:"):
        orthogonal_random_features(0, 4)
