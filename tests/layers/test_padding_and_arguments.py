"""LaplacianAttention (and the baselines' modules) with a key_padding_mask (docs/DESIGN.md §2.5), and argument
errors that name the argument."""

import pytest
import torch

from laplacianformer.baselines import NystromAttention, PerformerAttention, SoftAttention, SoftmaxAttention
from laplacianformer.layers import LaplacianAttention

MODULES = {
    "laplacian": lambda: LaplacianAttention(16, 2, landmarks=9),
    "laplacian-default": lambda: LaplacianAttention(16, 2),
    "gaussian-rowsum": lambda: LaplacianAttention(16, 2, kernel="gaussian", norm="rowsum", landmarks=9),
    "laplacian-exact-recompute": lambda: LaplacianAttention(16, 2, landmarks=None, recompute=True),
    "softmax": lambda: SoftmaxAttention(16, 2),
    "performer": lambda: PerformerAttention(16, 2, num_features=32),
    "nystromformer": lambda: NystromAttention(16, 2, num_landmarks=8),
    "soft": lambda: SoftAttention(16, 2, landmarks=8),
}


@pytest.mark.parametrize("name", list(MODULES))
def test_module_padded_batch_matches_each_sequence_alone(name):
    torch.manual_seed(0)
    module = MODULES[name]().double()
    lengths = [70, 52, 61]
    mask = torch.arange(70)[None] >= torch.tensor(lengths)[:, None]
    x = torch.randn(3, 70, 16, dtype=torch.float64)
    x = x.masked_fill(mask[..., None], 1e3).requires_grad_(True)
    out = module(x, key_padding_mask=mask)
    weight = torch.randn_like(out)
    (grad,) = torch.autograd.grad((out * weight).sum(), x)
    assert not out[mask].any() and not grad[mask].any()
    for b, n_valid in enumerate(lengths):
        alone = x[b : b + 1, :n_valid].detach().requires_grad_(True)
        ref = module(alone)
        (ref_grad,) = torch.autograd.grad((ref * weight[b : b + 1, :n_valid]).sum(), alone)
        torch.testing.assert_close(out[b : b + 1, :n_valid], ref, rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(grad[b : b + 1, :n_valid], ref_grad, rtol=1e-10, atol=1e-10)


def test_mask_passed_positionally_into_hw_is_named():
    attn = LaplacianAttention(16, 2)
    x = torch.randn(2, 20, 16)
    with pytest.raises(TypeError, match="^hw: got a bool tensor of shape \\(2, 20\\); a padding mask goes in key_padding_mask="):
        attn(x, torch.zeros(2, 20, dtype=torch.bool))


@pytest.mark.parametrize("hw,exc,match", [
    ((50,), ValueError, r"^hw: expected \(height, width\), got \(50,\)"),
    (50, ValueError, r"^hw: expected a \(height, width\) pair, got the single int 50"),
    ((5, 9), ValueError, r"^hw: expected height \* width == N = 50"),
    ((5.0, 10), TypeError, r"^hw: expected \(height, width\) ints"),
])
def test_bad_hw_is_named(hw, exc, match):
    attn = LaplacianAttention(16, 2)
    with pytest.raises(exc, match=match):
        attn(torch.randn(1, 50, 16), hw)


@pytest.mark.parametrize("landmarks", [-3, 0, (7, -1), (7, 7, 7), 2.5, "7"])
def test_bad_landmarks_fail_in_the_constructor(landmarks):
    with pytest.raises((ValueError, TypeError), match="^landmarks: "):
        LaplacianAttention(16, 2, landmarks=landmarks)
    with pytest.raises((ValueError, TypeError), match="^landmarks: "):
        SoftAttention(16, 2, landmarks=landmarks)


@pytest.mark.parametrize("kwargs,name", [(dict(attn_mask=torch.ones(20, 20, dtype=torch.bool)), "attn_mask"),
                                         (dict(is_causal=True), "is_causal")])
def test_module_rejects_attn_mask_and_is_causal_with_the_reason(kwargs, name):
    with pytest.raises(ValueError, match=f"^{name}: not supported: the pooled landmarks mix all positions"):
        LaplacianAttention(16, 2)(torch.randn(1, 20, 16), **kwargs)


def test_module_and_operator_default_landmarks_agree_on_sequences():
    """The module's default (7, 7) on a 1-D sequence is the operator's: 49 landmarks."""
    torch.manual_seed(0)
    attn = LaplacianAttention(16, 2).double().eval()
    q = torch.randn(1, 2, 100, 8, dtype=torch.float64)
    from laplacianformer.ops import laplacian_attention

    torch.testing.assert_close(attn.attend(q, q, q, None), laplacian_attention(q, q, q, **attn.attn_kwargs))
