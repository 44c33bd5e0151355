"""Loading as users of timm expect (docs/MODELS.md): ``img_size=`` at construction, a run's EMA weights
through ``from_pretrained(run_dir, ema=True)``, a weights file given directly, and clear errors otherwise."""

from __future__ import annotations

import pytest
import torch

import laplacianformer as lf
from laplacianformer.models import create_model


def test_img_size_is_accepted_and_recorded_as_timm_does():
    model = create_model("laplacianformer_micro", num_classes=10, in_chans=1, img_size=64)
    assert model.pretrained_cfg["input_size"] == (1, 64, 64) and model.config["img_size"] == [64, 64]
    assert model(torch.randn(1, 1, 96, 64)).shape == (1, 10)  # the model still runs at any size
    with pytest.raises(ValueError, match="^img_size: "):
        create_model("laplacianformer_micro", img_size=8)
    timm = pytest.importorskip("timm")
    m = timm.create_model("laplacianformer_micro", num_classes=3, img_size=(64, 96))
    assert timm.data.resolve_data_config({}, model=m)["input_size"] == (3, 64, 96)


def _run(tmp_path, name, **kw):
    from laplacianformer.train import TrainConfig, train

    out = tmp_path / name
    train(TrainConfig(data="digits", img_size=16, train_subset=64, test_subset=32, epochs=1, max_steps=2,
                      batch_size=32, model_kwargs={"stem_stride": 2}, out=str(out), progress=False, threads=1, **kw))
    return out


def test_from_pretrained_reads_ema_weights_and_weight_files(tmp_path):
    from laplacianformer.checkpoint import load_checkpoint

    run = _run(tmp_path, "ema", ema=True)
    ema = lf.from_pretrained(run, ema=True)
    shadow = load_checkpoint(run / "model_ema.safetensors")
    assert all(torch.equal(ema.state_dict()[k], v) for k, v in shadow.items())
    same = lf.from_pretrained(run / "model_ema.safetensors")  # the file itself, config from beside it
    assert all(torch.equal(same.state_dict()[k], v) for k, v in shadow.items())
    last = lf.from_pretrained(run / "model.safetensors")  # the raw weights, not the EMA (model_best is the EMA's)
    assert any(not torch.equal(last.state_dict()[k], v) for k, v in shadow.items())
    plain = _run(tmp_path, "plain")
    with pytest.raises(FileNotFoundError, match="^path: no model_ema.safetensors in the run directory"):
        lf.from_pretrained(plain, ema=True)
    with pytest.raises(ValueError, match="^path: .* is a weights file"):
        lf.from_pretrained(plain / "model.safetensors", ema=True)
    stray = tmp_path / "stray.safetensors"
    stray.write_bytes((plain / "model.safetensors").read_bytes())
    with pytest.raises(FileNotFoundError, match="^path: .*no saved config"):
        lf.from_pretrained(stray)


def test_head_of_another_class_count_is_reported():
    from laplacianformer.models.laplacianformer import checkpoint_filter_fn

    source = create_model("laplacianformer_micro", num_classes=10).state_dict()
    target = create_model("laplacianformer_micro", num_classes=5)
    with pytest.warns(UserWarning, match=r"head\.weight has shape \(10, .*another num_classes"):
        out = checkpoint_filter_fn(source, target)
    assert torch.equal(out["head.weight"], target.state_dict()["head.weight"])
