"""Attention presets (layers.ATTN_PRESETS, docs/DESIGN.md §7.6): one argument of the model, the train config
and the CLI; "tuned" is the configuration the committed accuracy selection chose on validation data."""

import json
from pathlib import Path

import pytest
import torch

from laplacianformer.layers import ATTN_PRESETS, LaplacianAttention, get_token_mixer, preset_kwargs
from laplacianformer.models import create_model

ROOT = Path(__file__).resolve().parents[2]
SMALL = dict(depths=(1, 1, 1, 1), embed_dims=(16, 32, 64, 128), num_heads=(1, 2, 2, 4))


def test_tuned_is_the_choice_of_the_committed_selection():
    from laplacianformer.experiments.accuracy import combination

    selection = json.loads((ROOT / "results/accuracy/selection.json").read_text())
    attn, kwargs = combination(selection["chosen"])
    assert attn == "laplacian" and ATTN_PRESETS["tuned"] == kwargs
    assert ATTN_PRESETS["paper"] == {}


def test_model_preset_sets_every_layer_and_explicit_kwargs_win():
    model = create_model("laplacianformer_micro", num_classes=3, attn_preset="tuned", attn_kwargs={"iters": 10}, **SMALL)
    layers = [m for m in model.modules() if isinstance(m, LaplacianAttention)]
    assert layers and all(m.tie_qk and m.settings.norm == "inline" and m.settings.lam == 0.5 for m in layers)
    assert all(m.settings.iters == 10 for m in layers)
    # the resolved output scale is stored (DESIGN §7.7): the inline norm has none ("one")
    assert model.config["attn_kwargs"] == {**ATTN_PRESETS["tuned"], "iters": 10, "norm_scale": "one"}
    override = create_model("laplacianformer_micro", attn_preset="tuned", attn_kwargs={"lam": 2.0}, **SMALL)
    assert all(m.settings.lam == 2.0 for m in override.modules() if isinstance(m, LaplacianAttention))
    # the saved config rebuilds the same model without the preset's name
    again = create_model("laplacianformer_micro", **{k: override.config[k] for k in ("attn", "attn_kwargs")}, **SMALL)
    assert again.config["attn_kwargs"] == override.config["attn_kwargs"]
    x = torch.randn(2, 3, 64, 64)
    assert torch.isfinite(model(x)).all()


def test_paper_preset_is_the_default_model():
    torch.manual_seed(0)
    a = create_model("laplacianformer_micro", attn_preset="paper", **SMALL)
    torch.manual_seed(0)
    b = create_model("laplacianformer_micro", **SMALL)
    assert a.config == b.config


def test_bad_presets_name_the_argument():
    with pytest.raises(ValueError, match="^attn_preset: expected one of \\['paper', 'tuned'\\], got 'fast'"):
        create_model("laplacianformer_micro", attn_preset="fast")
    with pytest.raises(ValueError, match="^attn_preset: the presets configure attn='laplacian', got attn='softmax'"):
        get_token_mixer("softmax", None, "tuned")
    with pytest.raises(TypeError, match="^attn_kwargs: expected a dict"):
        preset_kwargs("laplacian", "tuned", [("lam", 1.0)])
    assert preset_kwargs("gaussian", None, {"lam": 1.0}) == {"lam": 1.0}


def test_train_config_and_cli_take_the_preset():
    from laplacianformer.cli import UserError, build_parser
    from laplacianformer.train.config import TrainConfig

    with pytest.raises(ValueError, match="^attn_preset: expected one of"):
        TrainConfig(attn_preset="nope").validate()
    with pytest.raises(ValueError, match="^attn_preset: the presets configure"):
        TrainConfig(attn="gaussian", attn_preset="tuned").validate()
    args = build_parser().parse_args(["train", "--attn-preset", "tuned"])
    assert args.attn_preset == "tuned"
    with pytest.raises(UserError, match="--attn-preset: invalid choice: 'nope'"):
        build_parser().parse_args(["train", "--attn-preset", "nope"])
