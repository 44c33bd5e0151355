"""Warnings where a user of the attention layer is about to be surprised (issue 43, item 5): a class or register
token reaching a layer that was not told of it (timm's ``VisionTransformer(attn_layer=LaplacianAttention)``), and
``check_finite_inputs`` of the module."""

import warnings

import pytest
import torch

from laplacianformer.layers import LaplacianAttention
from laplacianformer.layers.token_attention import unstated_prefix_tokens


def caught(fn):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fn()
    return [str(w.message) for w in seen if "num_prefix_tokens" in str(w.message)]


@pytest.mark.parametrize("n,expected", [(65, 1), (69, 5), (66, 2), (64, 0), (49, 0), (1, 0), (5, 1), (200, 4)])
def test_unstated_prefix_tokens(n, expected):
    assert unstated_prefix_tokens(n) == expected


def test_timm_built_layer_warns_once_with_the_fix():
    """timm's blocks pass norm_layer: a layer built so, called without hw on 1 + 8·8 tokens, warns once."""
    layer = LaplacianAttention(16, 2, norm_layer=torch.nn.LayerNorm, landmarks=(4, 4))
    x = torch.randn(2, 65, 16)
    messages = caught(lambda: (layer(x), layer(x)))
    assert len(messages) == 1
    assert "N - 1 = 8x8" in messages[0] and "LaplacianAttention.with_options(num_prefix_tokens=1)" in messages[0]
    told = LaplacianAttention.with_options(num_prefix_tokens=1)(16, 2, norm_layer=torch.nn.LayerNorm)
    assert caught(lambda: told(x)) == []


def test_no_warning_for_ordinary_1d_sequences():
    plain = LaplacianAttention(16, 2)  # built directly: a 1-D sequence, whatever its length
    timm_like = LaplacianAttention(16, 2, norm_layer=torch.nn.LayerNorm)
    mask = torch.zeros(2, 65, dtype=torch.bool)
    mask[0, 60:] = True
    assert caught(lambda: [plain(torch.randn(2, n, 16)) for n in (65, 50, 10, 37)]) == []
    assert caught(lambda: timm_like(torch.randn(2, 65, 16), key_padding_mask=mask)) == []  # a padded 1-D batch
    assert caught(lambda: timm_like(torch.randn(2, 64, 16))) == []  # a square: no token before a grid
    assert caught(lambda: timm_like(torch.randn(2, 65, 16), (5, 13))) == []  # hw given


def test_vision_transformer_with_a_class_token_warns_without_num_prefix_tokens():
    timm = pytest.importorskip("timm")
    from timm.models.vision_transformer import VisionTransformer

    def build(layer, **kw):
        return VisionTransformer(img_size=16, patch_size=4, in_chans=1, num_classes=3, embed_dim=16, depth=2,
                                 num_heads=2, attn_layer=layer, **kw)

    x = torch.randn(1, 1, 16, 16)
    assert timm is not None
    messages = caught(lambda: build(LaplacianAttention)(x))
    assert len(messages) == 2 and all("num_prefix_tokens=1" in m for m in messages)  # once per layer
    assert len(caught(lambda: build(LaplacianAttention, reg_tokens=4)(x))) == 2
    assert caught(lambda: build(LaplacianAttention.with_options(num_prefix_tokens=1))(x)) == []
    assert caught(lambda: build(LaplacianAttention, class_token=False, global_pool="avg")(x)) == []


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_module_check_finite_inputs_names_x_and_the_batch_index(bad):
    layer = LaplacianAttention(16, 2, check_finite_inputs=True)
    x = torch.randn(3, 20, 16)
    x[1, 4, 2] = bad
    with pytest.raises(ValueError, match=r"^x: contains NaN or Inf values at batch index 1$"):
        layer(x)
    x[2, 0, 0] = bad
    with pytest.raises(ValueError, match=r"^x: contains NaN or Inf values at batch index 1 \(and 1 more of the 3\)"):
        layer(x)
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[1, 4:], mask[2, :] = True, False
    x[2, 0, 0] = 0.0
    assert layer(x, key_padding_mask=mask)[1, :4].isfinite().all()  # padded tokens may hold anything
    assert LaplacianAttention(16, 2)(x).shape == x.shape  # off by default


def test_operator_message_names_the_batch_index():
    from laplacianformer.ops import laplacian_attention

    q, k, v = (torch.randn(3, 2, 10, 4) for _ in range(3))
    v[2, 1, 3, 0] = float("nan")
    with pytest.raises(ValueError, match=r"^v: contains NaN or Inf values at batch index 2$"):
        laplacian_attention(q, k, v, landmarks=4, check_finite_inputs=True)
