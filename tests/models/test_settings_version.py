"""The default output scale and the files written before it changed (docs/DESIGN.md §4.6, §7.6, §7.7): the
whitened norms default to ``norm_scale="inv_n"``; a model saved, or a run started, under version 1 of the
defaults (no ``settings_version``, no ``norm_scale``) loads and resumes with the ``"one"`` it was trained with;
experiment cells keep version 1's defaults."""

from __future__ import annotations

import json

import pytest
import torch

import laplacianformer
from laplacianformer import create_model, laplacian_attention
from laplacianformer.experiments.protocol import cell_attn_kwargs
from laplacianformer.layers.token_mixer import saved_attn_kwargs
from laplacianformer.ops.settings import SETTINGS_VERSION, WHITENED_OUTPUT_SCALE, AttentionSettings
from laplacianformer.train.config import TrainConfig, saved_config


def test_the_whitened_norms_default_to_the_chosen_scale():
    assert WHITENED_OUTPUT_SCALE == "inv_n"
    assert AttentionSettings(32).norm_scale == "inv_n"
    assert AttentionSettings(32, norm="injective_nomean").norm_scale == "inv_n"
    assert AttentionSettings(32, norm="inline").norm_scale == "one"  # no whitened part: no scale
    assert AttentionSettings(32, norm_scale="one").norm_scale == "one"
    with pytest.raises(ValueError, match="norm_scale"):
        AttentionSettings(32, norm="rowsum", norm_scale="inv_n")
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 2, 64, 16, generator=gen, dtype=torch.float64) for _ in range(3))
    kwargs = dict(hw=(8, 8), landmarks=(4, 4))
    torch.testing.assert_close(laplacian_attention(q, k, v, **kwargs),
                               laplacian_attention(q, k, v, norm_scale="inv_n", **kwargs), rtol=0, atol=0)


def test_models_store_the_scale_they_were_built_with():
    assert create_model("laplacianformer_micro").config["attn_kwargs"] == {"norm_scale": "inv_n"}
    assert create_model("laplacianformer_micro", attn="softmax").config["attn_kwargs"] == {}
    tuned = create_model("laplacianformer_micro", attn_preset="tuned").config["attn_kwargs"]
    assert tuned["norm"] == "inline" and tuned["norm_scale"] == "one"


def test_a_version_1_model_file_loads_unscaled(tmp_path):
    model = create_model("laplacianformer_micro", num_classes=3, attn_kwargs={"norm_scale": "one"}).eval()
    laplacianformer.save_pretrained(model, tmp_path / "m")
    file = tmp_path / "m" / "config.json"
    data = json.loads(file.read_text())
    assert data["settings_version"] == SETTINGS_VERSION
    del data["settings_version"], data["config"]["attn_kwargs"]["norm_scale"]  # as version 0.1 wrote it
    file.write_text(json.dumps(data))
    (tmp_path / "m" / "model.safetensors").unlink()
    laplacianformer.hub.save_weights(model.state_dict(), tmp_path / "m" / "model.safetensors")
    loaded = laplacianformer.from_pretrained(tmp_path / "m").eval()
    assert loaded.config["attn_kwargs"]["norm_scale"] == "one"
    x = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(x), model(x))


def test_run_configs_of_version_1_keep_the_unscaled_map(tmp_path):
    old = TrainConfig.from_dict(saved_config({"attn": "laplacian", "attn_kwargs": {"lam": 2.0}}))
    assert old.attn_kwargs == {"lam": 2.0, "norm_scale": "one"}
    new = TrainConfig(attn_kwargs={"lam": 2.0})
    assert "settings_version" not in new.to_dict()  # the fields (recipes compare them)
    assert new.to_saved()["settings_version"] == SETTINGS_VERSION
    new.save(tmp_path / "train_config.json")
    assert TrainConfig.load(tmp_path / "train_config.json").attn_kwargs == {"lam": 2.0}  # the default: inv_n
    (tmp_path / "old.json").write_text(json.dumps({"attn": "laplacian", "attn_kwargs": {}}))
    assert TrainConfig.load(tmp_path / "old.json").attn_kwargs == {"norm_scale": "one"}
    assert saved_config({"attn": "softmax", "attn_kwargs": {}})["attn_kwargs"] == {}


def test_detection_configs_of_version_1_keep_the_unscaled_map():
    from laplacianformer.detection.engine import DetectConfig

    old = DetectConfig.from_dict({"backbone_kwargs": {}})
    assert old.backbone_kwargs == {"attn_kwargs": {"norm_scale": "one"}}
    saved = DetectConfig(backbone_kwargs={"attn": "softmax"}).to_dict()
    assert DetectConfig.from_dict(saved).backbone_kwargs == {"attn": "softmax"}
    assert DetectConfig.from_dict(DetectConfig().to_dict()).backbone_kwargs == {}


def test_experiment_cells_keep_version_1_defaults():
    assert cell_attn_kwargs("laplacian", {}) == {"norm_scale": "one"}
    assert cell_attn_kwargs("laplacian", {"norm_scale": "inv_n"}) == {"norm_scale": "inv_n"}
    assert cell_attn_kwargs("softmax", {"sr_ratio": 2}) == {"sr_ratio": 2}
    assert saved_attn_kwargs("gaussian", {"lam": 1.0}, SETTINGS_VERSION) == {"lam": 1.0}
