"""``laplacianformer predict``: one line per image on stdout, --json / --csv, progress lines without a
terminal, one-line errors naming the flag or file; ``eval`` of a single image points to it; the README's
first screen shows it."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import numpy as np
import pytest
import torch

import laplacianformer as lf
from laplacianformer.cli import main
from laplacianformer.models import create_model
from laplacianformer.train.progress import ENV_EVERY

TINY_MODEL = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}
NAMES = ("T-shirt/top", "Ankle boot", "Bag")
README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A save_pretrained directory: 3 classes with names, RGB at 24 px, its own mean / std."""
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=3, **TINY_MODEL)
    cfg = dict(model.pretrained_cfg, input_size=(3, 24, 24), mean=(0.5, 0.4, 0.3), std=(0.2, 0.2, 0.2),
               interpolation="bilinear", crop_pct=1.0, crop_mode="squash", label_names=NAMES, num_classes=3)
    return lf.save_pretrained(model, tmp_path_factory.mktemp("saved") / "m", pretrained_cfg=cfg)


@pytest.fixture(scope="module")
def images(tmp_path_factory):
    from PIL import Image

    root = tmp_path_factory.mktemp("imgs")
    rng = np.random.default_rng(0)
    (root / "sub").mkdir()
    Image.fromarray(rng.integers(0, 256, (30, 17), dtype=np.uint8), "L").save(root / "grey.png")
    Image.fromarray(rng.integers(0, 256, (9, 41, 4), dtype=np.uint8), "RGBA").save(root / "sub" / "rgba.png")
    Image.fromarray(rng.integers(0, 256, (50, 50, 3), dtype=np.uint8)).convert("P").save(root / "sub" / "pal.gif")
    (root / "notes.txt").write_text("not an image: folders give image files only")
    return root


@pytest.fixture(autouse=True)
def heap_calls(monkeypatch):
    """``--retain-heap`` would set this test process's allocator for good: record the calls instead."""
    from laplacianformer import heap

    calls = []
    monkeypatch.setattr(heap, "retain_freed_memory", lambda: calls.append(1) or True)
    return calls


def test_lines_json_csv_and_progress(saved, images, tmp_path, capsys, monkeypatch, heap_calls):
    monkeypatch.setenv(ENV_EVERY, "1e-9")
    argv = ["predict", "--run", str(saved), str(images), "--top-k", "2", "--batch-size", "2", "--device", "cpu",
            "--json", str(tmp_path / "p.json"), "--csv", str(tmp_path / "p.csv")]
    assert main(argv) == 0
    cap = capsys.readouterr()
    lines = cap.out.splitlines()
    paths = [str(images / "grey.png"), str(images / "sub" / "pal.gif"), str(images / "sub" / "rgba.png")]
    assert [line.split("  ")[0] for line in lines] == paths
    preds = json.loads((tmp_path / "p.json").read_text())
    assert preds["preprocessing"]["mean"] == [0.5, 0.4, 0.3] and preds["preprocessing"]["size"] == [24, 24]
    for line, p in zip(lines, preds["predictions"]):
        pairs = line.split("  ")[1:]
        assert len(pairs) == 2 and all(name.rpartition(":")[0] in NAMES for name in pairs)
        assert pairs == [f"{t['class']}:{t['prob']:.3f}" for t in p["top_k"]]
        assert p["top_k"][0]["prob"] >= p["top_k"][1]["prob"]
    rows = list(csv.reader((tmp_path / "p.csv").open()))
    assert rows[0] == ["path", "class_1", "prob_1", "class_2", "prob_2"] and [r[0] for r in rows[1:]] == paths
    progress = [line for line in cap.err.splitlines() if line.startswith("predict  image ")]
    assert [line.split()[2] for line in progress] == ["2/3", "3/3"]  # batches of 2
    assert heap_calls == [1]  # --retain-heap is on by default
    assert main([*argv, "--no-retain-heap"]) == 0 and heap_calls == [1]


@pytest.mark.parametrize("argv, needle", [
    (["--run", "{tmp}/nothing", "{img}"], "--run: {tmp}/nothing: no such run directory"),
    (["--run", "{saved}", "{tmp}/missing.png"], "{tmp}/missing.png: no such image file or folder"),
    (["--run", "{saved}", "{tmp}/bad.png"], "{tmp}/bad.png: cannot read image"),
    (["--run", "{saved}", "{img}", "--top-k", "0"], "--top-k: expected an integer >= 1, got 0"),
    (["--run", "{saved}", "{img}", "--device", "tpu"], "--device: expected 'auto', 'cpu'"),
    (["--run", "{tmp}/bad.png", "{img}"], "--run: "),
])
def test_errors_are_one_line_naming_the_flag_or_file(argv, needle, saved, images, tmp_path, capsys):
    (tmp_path / "bad.png").write_bytes(b"GIF89a truncated")
    fill = dict(tmp=tmp_path, saved=saved, img=images / "grey.png")
    assert main(["predict", *(a.format(**fill) for a in argv)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("laplacianformer: error: "), err
    assert needle.format(**fill) in err, err


def test_eval_of_a_file_points_to_predict(saved, images, capsys):
    assert main(["eval", "--checkpoint", str(saved), "--data", str(images / "grey.png")]) == 2
    err = capsys.readouterr().err
    assert "is a file" in err and "laplacianformer predict --run" in err and err.count("\n") == 1


def test_readme_first_screen_shows_predict():
    first = README.read_text().splitlines()[:16]
    assert any("laplacianformer predict --run" in line for line in first), first
