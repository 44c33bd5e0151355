"""The operator settings as one object (``ops/settings.py``): validated once where made (a module's constructor,
never its forward), passed whole to the operator, the one list of the operator's keywords, errors naming the
argument, and the key that carries them through TorchScript / torch.fx leaves."""

from __future__ import annotations

import dataclasses
import inspect
import math

import pytest
import torch

import laplacianformer.ops.settings as settings_module
from laplacianformer import LaplacianAttention, ops
from laplacianformer.layers.token_mixer import LAPLACIAN_ATTN_KWARGS, LAPLACIAN_MODULE_KWARGS
from laplacianformer.ops import AttentionSettings, laplacian_attention
from laplacianformer.ops.settings import DEFAULTS, OPERATOR_SETTINGS


@pytest.fixture
def validations(monkeypatch):
    """Counts the calls of the settings validator."""
    calls = []
    real = settings_module.validate
    monkeypatch.setattr(settings_module, "validate", lambda s: calls.append(s) or real(s))
    return calls


def test_module_validates_once_when_built_and_never_in_forward(validations):
    attn = LaplacianAttention(16, 2, norm="inline", lam=2.0, landmarks=(2, 2))
    assert len(validations) == 1
    x = torch.randn(2, 36, 16)
    attn(x, (6, 6))
    attn.train()(x, (6, 6)).sum().backward()
    assert len(validations) == 1
    recomputing = LaplacianAttention(16, 2, landmarks=(2, 2), recompute=True)
    recomputing(x.requires_grad_(), (6, 6)).sum().backward()
    assert len(validations) == 2


def test_model_attn_kwargs_reach_the_operator_through_the_settings(monkeypatch):
    from laplacianformer.models import create_model
    import laplacianformer.ops.attention as attention

    model = create_model("laplacianformer_micro", num_classes=3, attn_kwargs={"norm": "inline"}).eval()
    layers = [m for m in model.modules() if isinstance(m, LaplacianAttention)]
    assert layers and all(m.settings.norm == "inline" for m in layers)
    seen = []
    real = attention.attention_core
    monkeypatch.setattr(attention, "attention_core",
                        lambda q, k, v, s, *a, **kw: seen.append(s) or real(q, k, v, s, *a, **kw))
    with torch.no_grad():
        model(torch.randn(1, 3, 32, 32))
    assert len(seen) == len(layers)
    assert all(isinstance(s, AttentionSettings) and s.norm == "inline" for s in seen)
    # the layers' settings (equal objects: the key registry keeps the first object made for a key, which an
    # earlier test of the same process may have made), never rebuilt per call (counted in the test above)
    assert all(s in [m.settings for m in layers] for s in seen)


def test_defaults_are_resolved_and_the_bandwidth_folds_the_scale():
    s = AttentionSettings(32)
    assert (s.lam, s.qk_scale) == (4.0, 32 ** -0.5) and s.bandwidth == 4.0 / 32 ** -0.5
    g = AttentionSettings(32, kernel="gaussian")
    assert (g.lam, g.qk_scale) == (2.0 * math.sqrt(32), 1.0) and g.bandwidth == g.lam
    assert AttentionSettings(32, kernel="gaussian", qk_scale=0.5).bandwidth == g.lam / 0.25
    assert AttentionSettings(8, landmarks=[3, 4]).landmarks == (3, 4)
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.lam = 2.0


@pytest.mark.parametrize("kwargs, match", [
    (dict(kernel="cosine"), "^kernel: expected one of"),
    (dict(lam=0.0), "^lam: expected a finite number > 0"),
    (dict(qk_scale=float("nan")), "^qk_scale: expected a finite number"),
    (dict(norm="softmax"), "^norm: expected one of"),
    (dict(solver="lu"), "^solver: expected one of"),
    (dict(ns_backward="exact"), "^ns_backward: expected one of"),
    (dict(iters=0), "^iters: expected an int >= 1"),
    (dict(ns_eps=-1.0), "^ns_eps: expected a finite number >= 0"),
    (dict(norm_eps=0.0), "^norm_eps: expected a finite number > 0"),
    (dict(norm_scale="sqrt"), "^norm_scale: expected one of"),
    (dict(norm="inline", norm_scale="inv_n"), "^norm_scale: scales the whitened part"),
    (dict(landmarks=(2, 3, 4)), "^landmarks: expected an int, a \\(rows, cols\\) grid or None"),
])
def test_errors_name_the_argument(kwargs, match):
    with pytest.raises(ValueError, match=match):
        AttentionSettings(8, **kwargs)
    with pytest.raises(ValueError, match=match):
        LaplacianAttention(16, 2, **kwargs)
    q = torch.randn(1, 2, 16, 8)
    with pytest.raises(ValueError, match=match):
        laplacian_attention(q, q, q, hw=(4, 4), **{"landmarks": None, **kwargs})


def test_one_list_of_operator_keywords():
    params = inspect.signature(laplacian_attention).parameters
    assert {name: params[name].default for name in OPERATOR_SETTINGS} == DEFAULTS
    assert set(LAPLACIAN_ATTN_KWARGS) == (set(OPERATOR_SETTINGS) - {"kernel"}) | set(LAPLACIAN_MODULE_KWARGS)
    assert AttentionSettings(8, lam=2.0).options() == {**DEFAULTS, "lam": 2.0, "qk_scale": 8 ** -0.5, "norm_scale": "inv_n"}
    with pytest.raises(TypeError, match="LaplacianAttention: unexpected keyword argument\\(s\\) \\['lamda'\\]"):
        LaplacianAttention(16, 2, lamda=2.0)


def test_operator_takes_settings_or_keywords():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 36, 8, generator=gen, dtype=torch.float64) for _ in range(3))
    kw = dict(landmarks=(2, 3), lam=2.0, norm="inline", iters=7)
    s = AttentionSettings(8, **kw)
    torch.testing.assert_close(laplacian_attention(q, k, v, hw=(6, 6), settings=s),
                               laplacian_attention(q, k, v, hw=(6, 6), **kw), rtol=0, atol=0)
    with pytest.raises(TypeError, match="^settings: given together with the operator keywords \\['iters'\\]"):
        laplacian_attention(q, k, v, hw=(6, 6), settings=s, iters=3)
    with pytest.raises(ValueError, match="^settings: made for head_dim=4"):
        laplacian_attention(q, k, v, hw=(6, 6), settings=AttentionSettings(4, landmarks=(2, 3)))


def test_key_maps_back_to_the_settings():
    s = AttentionSettings(8, kernel="gaussian", landmarks=(2, 3), norm_scale="inv_n", iters=5)
    assert AttentionSettings.from_key(s.key) is s
    del settings_module._BY_KEY[s.key]  # as in another process, e.g. an unpickled FX graph
    again = AttentionSettings.from_key(s.key)
    assert again == s and again is not s and again.landmarks == (2, 3)


def test_module_settings_and_attn_kwargs():
    attn = LaplacianAttention(16, 2, kernel="gaussian", norm_scale="learned", landmarks=4)
    assert attn.settings.norm_scale == "inv_sqrt_n" and attn.norm_gain.shape == (2,)
    assert attn.landmarks == 4
    assert attn.attn_kwargs == {k: v for k, v in attn.settings.options().items() if k != "landmarks"}
    assert ops.OPERATOR_SETTINGS == OPERATOR_SETTINGS
