"""``detect predict``: --top-k and --max-per-class filters, drawings enlarged for small images with a legend
and labels legible on their colour; ``detect train`` prints timed progress lines without a terminal."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from laplacianformer.detection import cli
from laplacianformer.detection.predict import (
    MIN_SIDE, PALETTE, draw, drawing_scale, filter_note, predict_images, select, text_colour,
)
from laplacianformer.train.progress import ENV_EVERY

CATS = [{"id": 10 + i, "name": n} for i, n in enumerate(["coat", "bag", "ankle boot"])]


def _output(scores, labels, boxes=None) -> dict:
    n = len(scores)
    if boxes is None:
        boxes = [[4 + 3 * i, 5 + 2 * i, 30 + 3 * i, 40 + 2 * i] for i in range(n)]
    return {"boxes": torch.tensor(boxes, dtype=torch.float32).reshape(n, 4),
            "labels": torch.tensor(labels, dtype=torch.long), "scores": torch.tensor(scores)}


def test_select_threshold_top_k_and_per_class_cap():
    out = _output([0.2, 0.9, 0.5, 0.8, 0.7, 0.05], [1, 1, 2, 1, 3, 2])
    assert select(out, 0.1).tolist() == [1, 3, 4, 2, 0]  # best first
    assert select(out, 0.1, top_k=2).tolist() == [1, 3]
    assert select(out, 0.0, max_per_class=1).tolist() == [1, 4, 2]
    assert select(out, 0.0, top_k=2, max_per_class=1).tolist() == [1, 4]
    assert select(out, 0.95).tolist() == []
    with pytest.raises(ValueError, match="^max_per_class: "):
        select(out, 0.0, max_per_class=0)


def test_drawing_of_a_small_image_is_enlarged_with_a_legend():
    from PIL import Image

    rgb = Image.new("RGB", (96, 64), (90, 90, 90))
    out = _output([0.9, 0.6, 0.3], [1, 2, 3])
    keep = select(out, 0.5)
    note = filter_note(len(keep), 3, 0.5, None, None, 0.9)
    assert note == "2 of 3 detections (best score 0.90)\nscore >= 0.5"
    image = draw(rgb, out, CATS, keep, note=note)
    scale = drawing_scale(96, 64)
    assert scale == 8 and 64 * scale >= MIN_SIDE and drawing_scale(1024, 768) == 1
    assert image.height == 64 * scale and image.width > 96 * scale  # the legend strip on the right
    arr = np.asarray(image)
    legend, picture = arr[:, 96 * scale:], arr[:, :96 * scale]
    for lab in (1, 2):  # a swatch per class drawn, and its boxes in the picture
        assert (legend == PALETTE[lab - 1]).all(-1).any() and (picture == PALETTE[lab - 1]).all(-1).sum() > 100
    assert not (arr == PALETTE[2]).all(-1).any()  # the filtered-out class is neither drawn nor listed
    # the label of the box at (4, 5) sits above it, its height proportional to the drawing's shorter side
    label = (picture[: 5 * scale, 4 * scale:30 * scale] == PALETTE[0]).all(-1).any(1).sum()
    big = np.asarray(draw(Image.new("RGB", (2000, 1500), (90, 90, 90)), _output([0.9], [1], [[40, 100, 400, 500]]),
                          CATS, torch.tensor([0])))
    big_label = (big[:100, 40:400] == PALETTE[0]).all(-1).any(1).sum()
    assert 10 <= label and 2.4 < big_label / label < 3.6  # 1500 / 512 = 2.9
    assert text_colour((255, 225, 25)) == (0, 0, 0) and text_colour((145, 30, 180)) == (255, 255, 255)


class _Fixed(torch.nn.Module):
    """A detector stand-in returning the same output for every image."""

    def __init__(self, output: dict) -> None:
        super().__init__()
        self.output = output

    def forward(self, images):
        return [dict(self.output) for _ in images]


def test_predict_images_writes_the_filtered_detections(tmp_path, capsys):
    from PIL import Image

    Image.new("L", (64, 48), 40).save(tmp_path / "a.png")
    out = _output([0.9, 0.8, 0.7, 0.6, 0.1], [1, 1, 1, 2, 3])
    summary = predict_images(_Fixed(out), CATS, [tmp_path / "a.png"], tmp_path / "p", score_threshold=0.2,
                             top_k=3, max_per_class=2)
    entry = summary[str(tmp_path / "a.png")]
    assert [d["score"] for d in entry["detections"]] == pytest.approx([0.9, 0.8, 0.6])
    assert [d["category_id"] for d in entry["detections"]] == [10, 10, 11]
    assert entry["candidates"] == 5 and entry["best_score"] == pytest.approx(0.9)
    assert json.loads((tmp_path / "p" / "predictions.json").read_text()) == json.loads(json.dumps(summary))
    assert Image.open(tmp_path / "p" / "a.png").height == 48 * drawing_scale(64, 48)

    p = cli.build_parser().parse_args(["detect", "predict", "--run", "R", "x.png", "--out", "O", "--top-k", "5",
                                       "--max-per-class", "2"])
    assert (p.top_k, p.max_per_class) == (5, 2)
    with pytest.raises(SystemExit) as e:
        cli.build_parser().parse_args(["detect", "predict", "--run", "R", "x.png", "--out", "O", "--top-k", "0"])
    assert e.value.code == 2 and "--top-k: expected an integer >= 1" in capsys.readouterr().err


def test_detect_train_prints_timed_lines_without_a_terminal(scenes, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_EVERY, "1e-9")
    rc = cli.main(["train", "--data", str(scenes), "--backbone", "laplacianformer_micro", "--img-size", "64",
                   "--fpn-channels", "16", "--threads", "1", "--epochs", "1", "--max-steps", "2", "--batch-size", "2",
                   "--eval-every", "0", "--out", str(tmp_path / "run")])  # default --progress, but no terminal
    assert rc == 0
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("detect train  step ")]
    assert [line.split()[3] for line in lines] == ["1/2", "2/2"], lines
    assert "img/s" in lines[0] and "loss " in lines[0] and "ETA " in lines[0] and "epoch 1/1" in lines[0]
