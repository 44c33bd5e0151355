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
    # landmarks beyond the token grid: the exact kernel (the one landmark rule, docs/DESIGN.md §2.2)
    torch.testing.assert_close(soft_attention(q, q, hw=(3, 3), landmarks=(4, 4)),
                               soft_attention(q, q, hw=(3, 3), landmarks=None))


def test_soft_value_conv_is_one_3x3_filter_per_head_without_bias():
    """SOFT's DWConv(V): each head's filter acts on all d channels of that head (DESIGN.md §1.4)."""
    import torch.nn.functional as F

    from laplacianformer.baselines import SoftAttention

    torch.manual_seed(7)
    print("seed 7")
    m = SoftAttention(12, num_heads=3).double()
    assert m.dwconv.weight.shape == (3, 1, 3, 3) and m.dwconv.bias is None
    v_tok = torch.randn(2, 20, 12, dtype=torch.float64)
    got = m._value_conv(v_tok, (4, 5))
    grid = v_tok.view(2, 4, 5, 3, 4).permute(0, 4, 3, 1, 2).reshape(8, 3, 4, 5)  # (B·d, H, h, w): SOFT's layout
    ref = F.conv2d(grid, m.dwconv.weight, padding=1, groups=3).reshape(2, 4, 3, 4, 5).permute(0, 3, 4, 2, 1)
    torch.testing.assert_close(got, ref.reshape(2, 20, 12))
