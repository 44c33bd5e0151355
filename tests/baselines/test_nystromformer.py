import pytest
import torch

from laplacianformer.baselines import iterative_pinv, nystrom_attention, nystrom_attention_dense, segment_means


def _well_conditioned_qk(randn, b, h, n, d):
    q = randn(b, h, n, d, scale=2.0)
    return q, q + randn(b, h, n, d, scale=0.1)


def test_all_tokens_as_landmarks_equals_softmax_attention(randn):
    q, k = _well_conditioned_qk(randn, 2, 2, 12, 8)
    v = randn(2, 2, 12, 5)
    out = nystrom_attention(q, k, v, num_landmarks=12, iters=20)
    torch.testing.assert_close(out, nystrom_attention_dense(q, k, v), rtol=1e-9, atol=1e-11)


def test_pinv_matches_torch_pinv(randn):
    a = torch.softmax(randn(3, 10, 10, scale=2.0), dim=-1)
    torch.testing.assert_close(iterative_pinv(a, iters=25), torch.linalg.pinv(a), rtol=1e-8, atol=1e-8)


def test_pinv_init_is_per_matrix(randn):
    a = torch.softmax(randn(1, 8, 8, scale=2.0), dim=-1)
    big = 300.0 * torch.softmax(randn(1, 8, 8, scale=2.0), dim=-1)
    batch = iterative_pinv(torch.cat([a, big]), iters=25)
    torch.testing.assert_close(batch[:1], iterative_pinv(a, iters=25), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(batch[:1], torch.linalg.pinv(a), rtol=1e-8, atol=1e-8)


def test_segment_means(randn):
    x = randn(2, 3, 12, 4)
    torch.testing.assert_close(segment_means(x, 4), x.reshape(2, 3, 4, 3, 4).mean(-2))


def test_fewer_landmarks_approximates(randn):
    q, k = randn(1, 2, 64, 8, scale=0.3), randn(1, 2, 64, 8, scale=0.3)
    v = randn(1, 2, 64, 8)
    out = nystrom_attention(q, k, v, num_landmarks=16, iters=6)
    ref = nystrom_attention_dense(q, k, v)
    assert out.shape == ref.shape and torch.isfinite(out).all()
    assert ((out - ref).norm() / ref.norm()).item() < 0.1


def test_gradcheck(randn):
    q, k, v = (randn(1, 1, 4, 2).requires_grad_() for _ in range(3))
    assert torch.autograd.gradcheck(lambda a, b, c: nystrom_attention(a, b, c, num_landmarks=2, iters=3), (q, k, v))


def test_nystrom_validation(randn):
    q = randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="^num_landmarks:"):
        nystrom_attention(q, q, q, num_landmarks=6)
    with pytest.raises(ValueError, match="^a:"):
        iterative_pinv(randn(3, 4))
    with pytest.raises(ValueError, match="^iters:"):
        nystrom_attention(q, q, q, num_landmarks=2, iters=0)
