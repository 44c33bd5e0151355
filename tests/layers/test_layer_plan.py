"""The one plan of a layer call (``layers/plan.py``, docs/DESIGN.md §5.7): the pure function on its own, and the
layer's forward taking the path it names."""

from __future__ import annotations

import itertools

import pytest
import torch

from laplacianformer import LaplacianAttention
from laplacianformer.layers.plan import PATHS, CallKind, LayerTraits, layer_path

LAPLACIAN = LayerTraits(merges_value_conv=True, trains_from_qkv=True, dwconv=True, prefix=False, qk_norm=False,
                        recompute=False)
INFER = CallKind(masked=False, grad_mode=False, needs_grad=False, traced=False, fused_device=False)
TRAIN = CallKind(masked=False, grad_mode=True, needs_grad=True, traced=False, fused_device=True)


@pytest.mark.parametrize("layer, call, path", [
    (LAPLACIAN, INFER, "value_conv"),
    (LAPLACIAN, INFER._replace(grad_mode=True), "plain"),  # grad mode on, nothing requires grad
    (LAPLACIAN, INFER._replace(masked=True), "plain"),
    (LAPLACIAN._replace(prefix=True), INFER, "plain"),
    (LAPLACIAN._replace(dwconv=False), INFER, "plain"),
    (LAPLACIAN, INFER._replace(traced=True), "plain"),
    (LAPLACIAN._replace(merges_value_conv=False), INFER, "plain"),
    (LAPLACIAN, TRAIN, "fused_training"),
    (LAPLACIAN, TRAIN._replace(fused_device=False), "plain"),
    (LAPLACIAN._replace(recompute=True), TRAIN, "recompute"),
    (LAPLACIAN._replace(recompute=True), TRAIN._replace(masked=True), "recompute"),
    (LAPLACIAN._replace(qk_norm=True), TRAIN, "plain"),
    (LAPLACIAN, TRAIN._replace(masked=True), "plain"),
    (LAPLACIAN, TRAIN._replace(traced=True), "plain"),
    (LAPLACIAN._replace(trains_from_qkv=False), TRAIN, "plain"),
])
def test_layer_path(layer, call, path):
    assert layer_path(layer, call) == path


def test_every_combination_has_one_path_and_the_fused_paths_only_their_own_calls():
    for bits in itertools.product((False, True), repeat=len(LayerTraits._fields) + len(CallKind._fields)):
        layer, call = LayerTraits(*bits[:6]), CallKind(*bits[6:])
        path = layer_path(layer, call)
        assert path in PATHS
        if path in ("fused_training", "value_conv"):
            assert not call.masked and not layer.prefix and not call.traced
        if path == "fused_training":
            assert call.needs_grad and call.fused_device and not layer.recompute
        if path == "value_conv":
            assert not call.grad_mode and layer.dwconv


@pytest.mark.parametrize("mode, mask, expected", [
    ("infer", False, "value_conv"), ("infer", True, "plain"), ("train", False, "plain"), ("recompute", False, "recompute")])
def test_forward_takes_the_planned_path(monkeypatch, mode, mask, expected):
    layer = LaplacianAttention(16, 2, recompute=mode == "recompute")
    taken = []
    for name in ("_attend_value_conv", "_attend_recompute", "_attend_tokens"):
        real = getattr(layer, name)
        monkeypatch.setattr(layer, name, lambda *a, _real=real, _name=name, **k: taken.append(_name) or _real(*a, **k))
    x = torch.randn(2, 30, 16, requires_grad=mode != "infer")
    padding = torch.zeros(2, 30, dtype=torch.bool) if mask else None
    with torch.set_grad_enabled(mode != "infer"):
        layer(x, None, key_padding_mask=padding)
    names = {"value_conv": "_attend_value_conv", "recompute": "_attend_recompute", "plain": "_attend_tokens"}
    assert taken[:1] == [names[expected]]
