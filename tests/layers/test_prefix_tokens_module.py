"""Prefix tokens of ``LaplacianAttention`` (``num_prefix_tokens``, docs/DESIGN.md §2.7): the layer against its
formula written out (the operator with the prefix, DWConv(V) on the grid tokens only, the output projection), the
square grid inferred when ``hw`` is not given, the lean recompute, masks, TorchScript and torch.fx, errors."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from laplacianformer.baselines.softmax import SoftmaxAttention
from laplacianformer.layers import LaplacianAttention
from laplacianformer.ops import laplacian_attention


def written_out(layer: LaplacianAttention, x: torch.Tensor, hw, prefix: int) -> torch.Tensor:
    """proj(attention(q, k, v) + [0 for the prefix rows; DWConv3x3(V) of the grid]) from the layer's parameters."""
    b, n, c = x.shape
    heads, d = layer.num_heads, c // layer.num_heads
    q, k, v = F.linear(x, layer.qkv.weight, layer.qkv.bias).split(c, dim=-1)
    split = lambda t: t.reshape(b, n, heads, d).transpose(1, 2)
    attn = laplacian_attention(split(q), split(k), split(v), hw=hw, num_prefix_tokens=prefix,
                               settings=layer.settings).transpose(1, 2).reshape(b, n, c)
    grid = v[:, prefix:].transpose(1, 2).reshape(b, c, *hw)
    conv = F.conv2d(grid, layer.dwconv.weight, layer.dwconv.bias, padding=1, groups=c).flatten(2).transpose(1, 2)
    conv = torch.cat([torch.zeros(b, prefix, c, dtype=x.dtype), conv], dim=1)
    return layer.proj(attn + conv)


@pytest.mark.parametrize("prefix,hw,landmarks", [(1, (4, 4), (2, 2)), (3, (3, 5), (2, 3)), (2, (4, 4), None)],
                         ids=["cls", "cls+2reg-thin", "exact"])
def test_layer_equals_its_formula(prefix, hw, landmarks):
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, num_prefix_tokens=prefix, landmarks=landmarks).double()
    x = torch.randn(2, prefix + hw[0] * hw[1], 16, dtype=torch.float64, requires_grad=True)
    out = layer(x, hw)
    ref = written_out(layer, x, hw, prefix)
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-12)
    probe = torch.randn_like(out)
    for a, r in zip(torch.autograd.grad(out, [x, *layer.parameters()], probe),
                    torch.autograd.grad(ref, [x, *layer.parameters()], probe)):
        torch.testing.assert_close(a, r, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # the in-place merge of the heads into DWConv(V)
        torch.testing.assert_close(layer(x, hw), out.detach(), rtol=1e-12, atol=1e-12)


def test_square_grid_is_inferred_and_checked():
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, num_prefix_tokens=5, landmarks=(3, 3)).double()
    x = torch.randn(2, 5 + 36, 16, dtype=torch.float64)
    torch.testing.assert_close(layer(x), layer(x, (6, 6)), rtol=0, atol=0)
    with pytest.raises(ValueError, match=r"hw: not given, and the N - num_prefix_tokens = 40 - 5 = 35 tokens"):
        layer(x[:, :40])
    with pytest.raises(ValueError, match=r"hw: expected height \* width == N - num_prefix_tokens = 41 - 5 = 36"):
        layer(x, (5, 8))
    with pytest.raises(ValueError, match="num_prefix_tokens: expected fewer than the N = 5 tokens"):
        layer(x[:, :5])


def test_zero_prefix_is_the_layer_without_it():
    torch.manual_seed(0)
    plain = LaplacianAttention(16, 2, landmarks=(2, 3))
    zero = LaplacianAttention(16, 2, landmarks=(2, 3), num_prefix_tokens=0)
    zero.load_state_dict(plain.state_dict())
    x = torch.randn(2, 24, 16)
    for hw in ((4, 6), None):
        assert torch.equal(plain(x, hw), zero(x, hw))


@pytest.mark.parametrize("tie_qk", [False, True])
def test_lean_recompute_with_prefix_equals_plain(tie_qk):
    torch.manual_seed(0)
    plain = LaplacianAttention(16, 2, num_prefix_tokens=2, landmarks=(2, 2), tie_qk=tie_qk).double()
    lean = LaplacianAttention(16, 2, num_prefix_tokens=2, landmarks=(2, 2), tie_qk=tie_qk, recompute=True).double()
    lean.load_state_dict(plain.state_dict())
    x = torch.randn(2, 2 + 25, 16, dtype=torch.float64, requires_grad=True)
    assert "runs 'lean'" in lean.explain_recompute(x)
    a, b = plain(x), lean(x)
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    probe = torch.randn_like(a)
    for u, w in zip(torch.autograd.grad(a, [x, *plain.parameters()], probe),
                    torch.autograd.grad(b, [x, *lean.parameters()], probe)):
        torch.testing.assert_close(u, w, rtol=1e-9, atol=1e-11)


def test_mask_with_prefix_tokens():
    """A grid with a mask takes the exact kernel (pooled landmarks refuse it, docs/DESIGN.md §2.5); a padded
    prefix token (an unused register) gives a zero row and no gradient, and DWConv(V) never reads it."""
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, num_prefix_tokens=2, landmarks=None).double()
    x = torch.randn(2, 2 + 16, 16, dtype=torch.float64, requires_grad=True)
    mask = torch.zeros(2, 18, dtype=torch.bool)
    mask[1, 1] = True
    out = layer(x, key_padding_mask=mask)
    assert torch.equal(out[1, 1], torch.zeros(16, dtype=torch.float64))
    (grad,) = torch.autograd.grad(out.square().sum(), x)
    assert torch.equal(grad[1, 1], torch.zeros(16, dtype=torch.float64)) and torch.isfinite(grad).all()
    # the sequence with its padded register left out (a layer with one prefix token, the same weights): the
    # exact kernel's statistics count valid tokens, DWConv(V) sees the same grid, so the other tokens agree
    alone = LaplacianAttention(16, 2, num_prefix_tokens=1, landmarks=None).double()
    alone.load_state_dict(layer.state_dict())
    kept = [0, *range(2, 18)]
    torch.testing.assert_close(alone(x[1:2, kept]), out[1:2, kept], rtol=1e-10, atol=1e-12)
    pooled = LaplacianAttention(16, 2, num_prefix_tokens=2, landmarks=(2, 2)).double()
    with pytest.raises(ValueError, match="key_padding_mask: not supported on a 2-D token grid"):
        pooled(x, key_padding_mask=mask)


def test_script_and_fx_trace_match_eager():
    torch.manual_seed(0)
    layer = LaplacianAttention(16, 2, num_prefix_tokens=1, landmarks=(2, 2)).eval()
    x = torch.randn(2, 1 + 16, 16)
    with torch.no_grad():
        eager = layer(x)
        torch.testing.assert_close(torch.jit.script(layer)(x), eager, rtol=0, atol=0)
        traced = torch.fx.symbolic_trace(layer, concrete_args=dict(hw=None, key_padding_mask=None, attn_mask=None,
                                                                    is_causal=False))
        torch.testing.assert_close(traced(x), eager, rtol=0, atol=0)
        torch.testing.assert_close(traced(torch.randn(2, 1 + 25, 16)).shape, (2, 26, 16))


def test_with_options_and_errors():
    cls = LaplacianAttention.with_options(num_prefix_tokens=1, landmarks=(3, 3))
    layer = cls(16, num_heads=2, qkv_bias=False)
    assert issubclass(cls, LaplacianAttention) and layer.num_prefix_tokens == 1 and layer.landmarks == (3, 3)
    assert layer.qkv.bias is None and cls(16, 2, num_prefix_tokens=0).num_prefix_tokens == 0
    with pytest.raises(TypeError, match=r"with_options: LaplacianAttention takes no keyword \['prefix'\]"):
        LaplacianAttention.with_options(prefix=1)
    with pytest.raises(ValueError, match="num_prefix_tokens: expected an int >= 0, got -1"):
        LaplacianAttention(16, 2, num_prefix_tokens=-1)
    with pytest.raises(TypeError, match="num_prefix_tokens: expected an int"):
        LaplacianAttention(16, 2, num_prefix_tokens=1.5)
    with pytest.raises(ValueError, match="num_prefix_tokens: SoftmaxAttention takes no prefix tokens"):
        SoftmaxAttention(16, 2, num_prefix_tokens=1)


def test_with_options_layers_pickle_and_deepcopy():
    """torch.save(model) and copy.deepcopy (timm's EMA) of a model built from a ``with_options`` class."""
    import copy
    import io

    layer_class = LaplacianAttention.with_options(num_prefix_tokens=1, landmarks=(2, 2))
    net = torch.nn.Sequential(layer_class(16, 2)).eval()
    x = torch.randn(2, 1 + 16, 16)
    buf = io.BytesIO()
    torch.save(net, buf)
    buf.seek(0)
    for other in (torch.load(buf, weights_only=False), copy.deepcopy(net)):
        assert other[0].num_prefix_tokens == 1 and isinstance(other[0], LaplacianAttention)
        torch.testing.assert_close(other(x), net(x), rtol=0, atol=0)
