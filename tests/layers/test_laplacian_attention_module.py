"""LaplacianAttention module: shapes, any resolution, tied keys, DWConv path, gradients."""

import pytest
import torch

from laplacianformer import LaplacianAttention, laplacian_attention
from laplacianformer.ops.validation import resolve_landmarks


@pytest.mark.parametrize("hw", [(14, 14), (3, 5), (1, 1), (8, 20)])
@pytest.mark.parametrize("tie_qk", [False, True])
def test_shapes_and_gradients_at_any_grid(hw, tie_qk):
    attn = LaplacianAttention(32, 4, tie_qk=tie_qk)
    x = torch.randn(2, hw[0] * hw[1], 32, requires_grad=True)
    y = attn(x, hw)
    assert y.shape == x.shape
    y.square().mean().backward()
    assert torch.isfinite(x.grad).all()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_one_dimensional_tokens():
    attn = LaplacianAttention(16, 2, landmarks=8)
    x = torch.randn(3, 50, 16)
    assert attn(x).shape == x.shape


def test_module_landmark_rule_clamps_and_falls_back_to_exact():
    """The modules use ``resolve_landmarks(...)`` (DESIGN.md §2)."""
    assert resolve_landmarks((7, 7), (14, 14), 196) == (7, 7)
    assert resolve_landmarks((7, 7), (4, 12), 48) == (4, 7)
    assert resolve_landmarks((7, 7), (7, 7), 49) is None
    assert resolve_landmarks((7, 7), (2, 2), 4) is None
    assert resolve_landmarks(49, (14, 14), 196) == (7, 7)
    assert resolve_landmarks(8, None, 6) is None
    assert resolve_landmarks((7, 7), None, 100) == 49
    # without clamp (the operator) the same sizes that fit give the same layout
    assert resolve_landmarks((7, 7), (14, 14), 196) == (7, 7) and resolve_landmarks(49, (14, 14), 196) == (7, 7)


def test_non_square_int_on_a_grid_is_an_error_in_operator_and_module():
    """landmarks=50 on a 14x14 grid: one rule for ``laplacian_attention`` and ``LaplacianAttention``."""
    q = torch.randn(1, 2, 196, 8)
    with pytest.raises(ValueError, match="^landmarks: with a 2-D grid an int must be a perfect square"):
        laplacian_attention(q, q, q, hw=(14, 14), landmarks=50)
    attn = LaplacianAttention(16, 2, landmarks=50)
    with pytest.raises(ValueError, match="^landmarks: with a 2-D grid an int must be a perfect square"):
        attn(torch.randn(1, 196, 16), (14, 14))
    assert attn(torch.randn(1, 100, 16)).shape == (1, 100, 16)  # 1-D: 50 landmarks are fine
    sq = LaplacianAttention(16, 2, landmarks=49)
    assert sq(torch.randn(1, 196, 16), (14, 14)).shape == (1, 196, 16)


def test_module_equals_functional_composition():
    torch.manual_seed(0)
    attn = LaplacianAttention(16, 2, landmarks=(2, 2), dwconv=True).double()
    x = torch.randn(1, 36, 16, dtype=torch.float64)
    q, k, v = attn.qkv(x).reshape(1, 36, 3, 2, 8).permute(2, 0, 3, 1, 4)
    core = laplacian_attention(q, k, v, hw=(6, 6), landmarks=(2, 2))
    vmap = v.transpose(1, 2).reshape(1, 36, 16).transpose(1, 2).reshape(1, 16, 6, 6)
    conv = attn.dwconv(vmap).flatten(2).transpose(1, 2).reshape(1, 36, 2, 8).transpose(1, 2)
    ref = attn.proj((core + conv).transpose(1, 2).reshape(1, 36, 16))
    torch.testing.assert_close(attn(x, (6, 6)), ref)


@pytest.mark.parametrize("tie_qk", [False, True])
@pytest.mark.parametrize("hw", [(6, 6), None])
def test_recompute_gives_the_same_values_and_gradients(tie_qk, hw):
    """recompute=True (the core recomputed in the backward) changes memory, not results (to float64 rounding:
    its forward pools the landmarks without autograd, by the C loop, the plain one by the products)."""
    torch.manual_seed(0)
    plain = LaplacianAttention(16, 2, landmarks=(2, 2) if hw else 4, tie_qk=tie_qk).double()
    lean = LaplacianAttention(16, 2, landmarks=(2, 2) if hw else 4, tie_qk=tie_qk, recompute=True).double()
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(2, 36, 16, dtype=torch.float64)
    grads = []
    for mod in (plain, lean):
        xi = x.clone().requires_grad_(True)
        y = mod(xi, hw)
        y.square().sum().backward()
        grads.append((y.detach(), xi.grad, [p.grad for p in mod.parameters()]))
    torch.testing.assert_close(grads[0][0], grads[1][0], rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(grads[0][1], grads[1][1], rtol=1e-12, atol=1e-12)
    for a, b in zip(grads[0][2], grads[1][2]):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_recompute_keeps_fewer_tensors_for_backward():
    sizes = []
    for recompute in (False, True):
        attn = LaplacianAttention(32, 2, recompute=recompute)
        kept = {}
        x = torch.randn(1, 28 * 28, 32, requires_grad=True)

        def pack(t):
            kept[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            attn(x, (28, 28))
        sizes.append(sum(kept.values()))
    assert sizes[1] < 0.6 * sizes[0], sizes


def test_training_after_inference_mode_call():
    """Cached constants (the landmark pooling matrices) built under inference_mode must not break a later
    training call (autograd cannot save inference tensors)."""
    attn = LaplacianAttention(16, 2)
    x = torch.randn(1, 100, 16)
    with torch.inference_mode():
        attn(x, (10, 10))
    x.requires_grad_(True)
    attn(x, (10, 10)).sum().backward()
    assert torch.isfinite(x.grad).all()
