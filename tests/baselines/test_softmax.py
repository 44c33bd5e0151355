import pytest
import torch

from laplacianformer.baselines import softmax_attention, softmax_attention_naive


@pytest.mark.parametrize("n, d, dv", [(7, 4, 5), (33, 8, 8)])
@pytest.mark.parametrize("scale", [None, 0.3])
def test_sdpa_matches_dense_values_and_grads(randn, n, d, dv, scale):
    q, k = randn(2, 3, n, d), randn(2, 3, n, d)
    v = randn(2, 3, n, dv)
    leaves = [t.clone().requires_grad_() for t in (q, k, v)]
    copies = [t.clone().requires_grad_() for t in (q, k, v)]
    out = softmax_attention(*leaves, scale=scale)
    ref = softmax_attention_naive(*copies, scale=scale)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    g = randn(*out.shape)
    out.backward(g)
    ref.backward(g)
    for a, b in zip(leaves, copies):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-10, atol=1e-12)


def test_softmax_validation(randn):
    q = randn(1, 2, 5, 4)
    with pytest.raises(ValueError, match="^k:"):
        softmax_attention(q, randn(1, 2, 6, 4), q)
    with pytest.raises(ValueError, match="^scale:"):
        softmax_attention(q, q, q, scale=-1.0)
    with pytest.raises(TypeError, match="^v:"):
        softmax_attention(q, q, q.long())
