"""A short real training run (issue 4): 640 real digit images, 2 epochs, the Laplacian micro backbone.

Measured while writing this test (threads=1, seeds 0 and 1): test top-1 0.78 and 0.88 after 2 epochs
(0.73 / 0.64 after one), chance is 0.10; we assert 0.5. Also checks the run directory's files."""

from __future__ import annotations

import csv
import json

from laplacianformer.train import train

from train_helpers import tiny_config


def test_short_run_learns_far_above_chance_and_writes_its_run_dir(tmp_path):
    out = tmp_path / "run"
    r = train(tiny_config(out, train_subset=640, test_subset=300, epochs=2, lr=3e-3, warmup_epochs=0.5))
    assert r["top1"] >= 0.5, r["history"]
    assert r["top5"] >= r["top1"] and r["eval_n"] == 300 and r["steps"] == 40
    assert r["history"][-1]["train_loss"] < r["history"][0]["train_loss"]
    assert r["images_per_s"] > 0 and r["peak_memory_mb"] > 0 and r["params"] > 0
    for name in ("train_config.json", "config.json", "log.jsonl", "epochs.csv", "epochs.json", "curves.png",
                 "checkpoint.safetensors", "model.safetensors", "model_best.safetensors", "summary.json"):
        assert (out / name).stat().st_size > 0, name
    assert len((out / "log.jsonl").read_text().splitlines()) == 40
    rows = list(csv.DictReader(open(out / "epochs.csv")))
    assert [int(x["epoch"]) for x in rows] == [1, 2]
    assert json.loads((out / "train_config.json").read_text())["attn"] == "laplacian"
    assert json.loads((out / "config.json").read_text())["config"]["attn"] == "laplacian"  # the saved model
    assert sum(map(sum, r["confusion"])) == 300


def test_a_run_directory_loads_with_from_pretrained(tmp_path):
    """``laplacianformer.from_pretrained(run_dir)``: the best weights, the run's preprocessing and classes."""
    import pytest
    import torch

    import laplacianformer
    from laplacianformer.checkpoint import load_checkpoint
    from laplacianformer.data import build_datasets

    timm = pytest.importorskip("timm")
    out = tmp_path / "run"
    r = train(tiny_config(out, train_subset=96, test_subset=64, epochs=2, max_steps=4))
    model = laplacianformer.from_pretrained(out).eval()
    best = load_checkpoint(out / "model_best.safetensors")
    assert all(torch.equal(v, best[k]) for k, v in model.state_dict().items())
    data = timm.data.resolve_data_config({}, model=model)
    assert data["input_size"] == (1, 16, 16) and data["mean"] == (0.3,) and data["std"] == (0.4,)
    assert model.pretrained_cfg["label_names"] == tuple(r["classes"]) and model.num_classes == 10
    test = build_datasets("digits", 16, test_subset=64, train_subset=1).test
    x = (test.images[:8].float() / 255 - 0.3) / 0.4
    with torch.no_grad():
        logits = model(x)
    assert logits.shape == (8, 10) and torch.isfinite(logits).all()
    # the best-rule falls back to the last weights; a saved model loads the same way
    (out / "model_best.safetensors").unlink()
    last = laplacianformer.from_pretrained(out).eval()
    assert all(torch.equal(v, load_checkpoint(out / "model.safetensors")[k]) for k, v in last.state_dict().items())
    # a run of laplacianformer before 0.1 (config.json held the training settings) is refused, saying what to do
    (out / "config.json").write_text((out / "train_config.json").read_text())
    (out / "train_config.json").unlink()
    with pytest.raises(ValueError, match=r"^path: .*config\.json is not a laplacianformer/1 config \(format=None\); "
                                         r"a config\.json holding a run's training settings is a layout of "
                                         r"laplacianformer before 0\.1, no longer read: retrain"):
        laplacianformer.from_pretrained(out)


def test_image_folder_bf16_randaugment_and_resume_with_more_epochs(tmp_path):
    import numpy as np
    import pytest

    pytest.importorskip("torchvision", reason="RandAugment comes from torchvision (the timm extra)")
    from PIL import Image

    root = tmp_path / "imgs"
    rng = np.random.default_rng(0)
    for c in ("a", "b", "c"):
        (root / c).mkdir(parents=True)
        for i in range(6):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    out = tmp_path / "run"
    cfg = tiny_config(out, data=str(root), train_subset=None, test_subset=None, batch_size=8, amp="bf16",
                      randaugment=True, hflip=True)
    r = train(cfg)
    assert r["steps"] == 2 and r["eval_n"] == 3 and len(r["per_class"]) == 3
    with pytest.raises(ValueError, match="^epochs: resuming .* from 2 to 4 steps"):
        train(resume=out, epochs=2)  # more epochs change the schedule: refused unless allowed
    r2 = train(resume=out, epochs=2, allow_schedule_change=True)
    assert r2["steps"] == 4 and [h["epoch"] for h in r2["history"]] == [1, 2]


def test_progress_lines_count_the_epochs_max_steps_leaves(tmp_path, capsys):
    """``--max-steps 2`` of a 10-epoch schedule trains one epoch: the lines say 'epoch 1/1', not '1/10'."""
    r = train(tiny_config(tmp_path / "run", train_subset=64, test_subset=32, epochs=10, max_steps=2))
    err = capsys.readouterr().err
    assert r["steps"] == 2 and "epoch 1/1 " in err and "/10 " not in err
