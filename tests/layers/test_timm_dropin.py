"""``LaplacianAttention`` as timm's ``attn_layer`` (docs/MODELS.md): timm's VisionTransformer builds it with its
``Attention`` arguments (qkv_bias, qk_norm, proj_bias, attn_drop, proj_drop, norm_layer, device, dtype) and
calls ``attn(x, attn_mask=None, is_causal=False)``; the class token makes N = 1 + grid, a 1-D sequence for the
plain layer, and the grid after the class and register tokens with ``LaplacianAttention.with_options(
num_prefix_tokens=...)`` (docs/DESIGN.md §2.7)."""

from __future__ import annotations

import pytest
import torch

from laplacianformer.layers import LaplacianAttention

timm = pytest.importorskip("timm")


def _trains(model, steps: int = 6) -> None:
    """A few AdamW steps on one fixed batch of 1×32×32 images: finite losses, the last below the first."""
    x, y = torch.randn(8, 1, 32, 32), torch.randint(0, 10, (8,))
    opt = torch.optim.AdamW(model.parameters(), 1e-3)
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert all(torch.isfinite(torch.tensor(losses))) and losses[-1] < losses[0]


@pytest.mark.parametrize("qk_norm", [False, True])
def test_vision_transformer_trains_with_the_drop_in(qk_norm):
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    model = VisionTransformer(img_size=32, patch_size=4, in_chans=1, num_classes=10, embed_dim=64, depth=2,
                              num_heads=2, attn_layer=LaplacianAttention, qk_norm=qk_norm)
    attn = model.blocks[0].attn
    assert isinstance(attn, LaplacianAttention) and attn.qkv.bias is not None  # timm's qkv_bias=True default
    assert isinstance(attn.q_norm, torch.nn.LayerNorm) == qk_norm
    _trains(model)


@pytest.mark.parametrize("reg_tokens", [0, 2])
def test_vision_transformer_with_prefix_tokens_uses_2d_landmarks_and_trains(reg_tokens, monkeypatch):
    from timm.models.vision_transformer import VisionTransformer

    from laplacianformer.ops import nystrom

    pooled = []
    grid_landmarks = nystrom.grid_landmarks

    def recording(qs, hw, grid, mask, prefix=0):
        pooled.append((qs.shape[2], hw, grid, prefix))
        return grid_landmarks(qs, hw, grid, mask, prefix)

    monkeypatch.setattr(nystrom, "grid_landmarks", recording)
    torch.manual_seed(0)
    attn_layer = LaplacianAttention.with_options(num_prefix_tokens=1 + reg_tokens, landmarks=(4, 4))
    model = VisionTransformer(img_size=32, patch_size=4, in_chans=1, num_classes=10, embed_dim=32, depth=1,
                              num_heads=2, attn_layer=attn_layer, reg_tokens=reg_tokens)
    assert model.num_prefix_tokens == 1 + reg_tokens
    assert all(block.attn.num_prefix_tokens == model.num_prefix_tokens for block in model.blocks)
    _trains(model)
    # every layer pooled the 8×8 patch grid after the prefix tokens to 4×4 landmarks
    assert pooled and set(pooled) == {(1 + reg_tokens + 64, (8, 8), (4, 4), 1 + reg_tokens)}


def test_timm_arguments_and_masks():
    attn = LaplacianAttention(32, 2, qkv_bias=False, qk_norm=True, scale_norm=True, proj_bias=False,
                              norm_layer=torch.nn.LayerNorm, dtype=torch.float64)
    assert attn.qkv.bias is None and attn.proj.bias is None and attn.qkv.weight.dtype == torch.float64
    assert isinstance(attn.norm, torch.nn.LayerNorm) and attn.norm.normalized_shape == (32,)
    x = torch.randn(2, 50, 32, dtype=torch.float64)
    assert attn(x, attn_mask=None, is_causal=False).shape == x.shape
    with pytest.raises(ValueError, match="attn_mask"):
        attn(x, attn_mask=torch.zeros(50, 50, dtype=torch.bool))
    with pytest.raises(ValueError, match="is_causal"):
        attn(x, is_causal=True)


def test_qk_norm_with_recompute_checkpoints_and_matches():
    torch.manual_seed(0)
    plain = LaplacianAttention(32, 2, qk_norm=True).double()
    recomputing = LaplacianAttention(32, 2, qk_norm=True, recompute=True).double()
    recomputing.load_state_dict(plain.state_dict())
    x = torch.randn(2, 100, 32, dtype=torch.float64, requires_grad=True)
    a, b = plain(x, (10, 10)), recomputing(x, (10, 10))
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    ga = torch.autograd.grad(a.sum(), [x, *plain.parameters()])
    gb = torch.autograd.grad(b.sum(), [x, *recomputing.parameters()])
    for u, w in zip(ga, gb):
        torch.testing.assert_close(u, w, rtol=1e-9, atol=1e-11)
