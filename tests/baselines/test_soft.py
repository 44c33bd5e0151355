import pytest
import torch

from laplacianformer.baselines import soft_attention, soft_attention_dense, soft_bandwidth


@pytest.mark.parametrize("hw", [(4, 5), None])
def test_landmarks_on_every_token_exact_solver_equals_dense(randn, hw):
    q = randn(2, 2, 20, 8)
    v = randn(2, 2, 20, 6)
    grid = (4, 5) if hw else 20
    leaves = [q.clone().requires_grad_(), v.clone().requires_grad_()]
    copies = [q.clone().requires_grad_(), v.clone().requires_grad_()]
    out = soft_attention(*leaves, hw=hw, landmarks=grid, solver="exact", ns_eps=0.0)
    ref = soft_attention_dense(*copies)
    torch.testing.assert_close(out, ref, rtol=1e-9, atol=1e-10)
    g = randn(*out.shape)
    out.backward(g)
    ref.backward(g)
    for a, b in zip(leaves, copies):
        torch.testing.assert_close(a.grad, b.grad, rtol=1e-8, atol=1e-9)


def test_exact_kernel_path_equals_dense(randn):
    q, v = randn(1, 2, 9, 4), randn(1, 2, 9, 4)
    torch.testing.assert_close(soft_attention(q, v, hw=(3, 3), landmarks=None), soft_attention_dense(q, v))


def test_bandwidth():
    assert soft_bandwidth(16) == 8.0


def test_soft_validation(randn):
    q = randn(1, 2, 9, 4)
    with pytest.raises(ValueError, match="^v:"):
        soft_attention(q, randn(1, 2, 8, 4), hw=(3, 3), landmarks=(2, 2))
    with pytest.raises(ValueError, match="^landmarks:"):
        soft_attention(q, q, hw=(3, 3), landmarks=(4, 4))
