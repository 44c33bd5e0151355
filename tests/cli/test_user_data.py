"""The CLI on a user's own data: eval of a whole folder, runs that work from another directory, resuming
with other epochs, progress lines without a terminal, consistent times in summary.json."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from laplacianformer.cli import main
from laplacianformer.train.schedule import lr_at

TINY_MODEL = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}


def _tiny(data, out, *extra):
    return ["train", "--data", str(data), "--img-size", "16", "--batch-size", "8", "--model-kwargs",
            json.dumps(TINY_MODEL), "--threads", "1", "--no-hflip", "--out", str(out), *extra]


def _folder(root: Path, counts: dict[str, int], seed: int = 0) -> Path:
    from PIL import Image

    rng = np.random.default_rng(seed)
    for c, n in counts.items():
        (root / c).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(rng.integers(0, 256, (20, 24, 3), dtype=np.uint8)).save(root / c / f"{i}.png")
    return root


@pytest.fixture(scope="module")
def folder_run(tmp_path_factory):
    """A run trained on a plain class folder (3 classes x 6 images: 80/20 split), started with relative
    paths from the folder's parent directory."""
    base = tmp_path_factory.mktemp("user")
    _folder(base / "imgs", {"a": 6, "b": 6, "c": 6})
    cwd = os.getcwd()
    os.chdir(base)
    try:
        assert main(_tiny("imgs", "runs/r", "--epochs", "1", "--no-progress")) == 0
    finally:
        os.chdir(cwd)
    return base


def _eval(capsys, run, *extra):
    rc = main(["eval", "--checkpoint", str(run), "--no-progress", *extra])
    out = capsys.readouterr()
    assert rc == 0, out.err
    return json.loads(Path(out.out.strip().splitlines()[-1].split("wrote ")[1].split(" and ")[0]).read_text())


def test_run_stores_an_absolute_data_path_and_evaluates_from_elsewhere(folder_run, capsys, tmp_path, monkeypatch):
    run = folder_run / "runs" / "r"
    stored = json.loads((run / "train_config.json").read_text())["data"]
    assert Path(stored).is_absolute() and Path(stored) == (folder_run / "imgs").resolve()
    monkeypatch.chdir(tmp_path)
    res = _eval(capsys, run, "--out", str(tmp_path / "own"))
    assert res["n"] == 3 and res["classes"] == ["a", "b", "c"]  # the run's own held-out split


def test_eval_data_folder_scores_every_image(folder_run, capsys, tmp_path):
    run = folder_run / "runs" / "r"
    res = _eval(capsys, run, "--data", str(folder_run / "imgs"), "--out", str(tmp_path / "all"))
    assert res["n"] == 18 and sum(map(sum, res["confusion"])) == 18
    other = _folder(tmp_path / "new", {"c": 2, "a": 3}, seed=1)  # a subset of the classes, other images
    res = _eval(capsys, run, "--data", str(other), "--out", str(tmp_path / "new_out"))
    assert res["n"] == 5 and res["classes"] == ["a", "b", "c"]
    assert [sum(row) for row in res["confusion"]] == [3, 0, 2] and res["per_class"][1] is None


def test_eval_folder_with_only_a_val_split(folder_run, capsys, tmp_path):
    run = folder_run / "runs" / "r"
    _folder(tmp_path / "ds" / "val", {"a": 2, "b": 2, "c": 1}, seed=2)
    res = _eval(capsys, run, "--data", str(tmp_path / "ds"), "--out", str(tmp_path / "o"))
    assert res["n"] == 5
    # training needs a train/ split next to it
    assert main(_tiny(tmp_path / "ds", tmp_path / "r2", "--epochs", "1")) == 2
    assert "no train/" in capsys.readouterr().err


def test_eval_folder_with_an_unknown_class_names_it(folder_run, capsys, tmp_path):
    _folder(tmp_path / "odd", {"a": 1, "zebra": 1})
    assert main(["eval", "--checkpoint", str(folder_run / "runs" / "r"), "--data", str(tmp_path / "odd")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "zebra" in err and err.startswith("laplacianformer: error: ")


def test_resume_with_other_epochs_is_refused_or_announced(tmp_path, capsys):
    from laplacianformer.train.config import TrainConfig

    out = tmp_path / "run"
    assert main(_tiny("digits", out, "--epochs", "1", "--train-subset", "32", "--test-subset", "16",
                      "--no-progress", "--warmup-epochs", "0")) == 0
    capsys.readouterr()
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert main(["train", "--resume", str(out), "--epochs", "2"]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith("laplacianformer: error: --epochs: resuming") and "--allow-schedule-change" in err
    assert "from 4 to 8 steps" in err
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # nothing written
    assert main(["train", "--resume", str(out), "--epochs", "2", "--allow-schedule-change", "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert "warning: epochs: resuming with epochs=2 (the run has epochs=1)" in err
    cfg = TrainConfig.load(out / "train_config.json")
    rows = [json.loads(line) for line in (out / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == list(range(1, 9))
    expect = lr_at(4, total_steps=8, warmup_steps=0, base_lr=cfg.lr, min_lr=cfg.min_lr)
    assert rows[4]["lr"] == pytest.approx(expect)  # the new schedule from the resumed step on
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wall_time_s"] >= summary["train_time_s"] > 0  # both over the two sessions
    assert summary["session_wall_time_s"] < summary["wall_time_s"]
    assert main(["train", "--allow-schedule-change", *(_tiny("digits", tmp_path / "x")[1:])]) == 2


def test_progress_lines_without_a_terminal(tmp_path, capsys):
    out = tmp_path / "run"
    # default --progress, but stderr is not a terminal here: lines instead of bars
    assert main(_tiny("digits", out, "--epochs", "2", "--train-subset", "32", "--test-subset", "16",
                      "--log-every", "3")) == 0
    err = capsys.readouterr().err.splitlines()
    epochs = [line for line in err if line.startswith("epoch ") and "test top-1" in line]
    steps = [line for line in err if line.startswith("epoch ") and "img/s" in line]
    assert [line.split()[1] for line in epochs] == ["1/2", "2/2"]
    assert [line.split()[3] for line in steps] == ["3/8", "6/8"]
    assert not any("\r" in line or "it/s" in line for line in err)  # no tqdm bar
    summary = json.loads((out / "summary.json").read_text())
    assert summary["wall_time_s"] >= summary["train_time_s"] > 0
    assert summary["session_wall_time_s"] == summary["wall_time_s"]  # one session
