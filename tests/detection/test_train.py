"""``detect train / eval / predict`` end to end on a tiny FashionScenes set, and kill/resume equality."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from laplacianformer.checkpoint import load_checkpoint, read_metadata
from laplacianformer.detection import cli

SMALL = ["--backbone", "laplacianformer_micro", "--img-size", "128", "--fpn-channels", "32", "--threads", "1",
         "--no-progress"]
SRC = Path(__file__).resolve().parents[2] / "src"


def test_retinanet_two_steps_then_eval_and_predict(scenes, tmp_path, capsys):
    run = tmp_path / "run"
    rc = cli.main(["train", "--data", str(scenes), "--detector", "retinanet", *SMALL, "--epochs", "1",
                   "--max-steps", "2", "--batch-size", "2", "--score-thresh", "0", "--out", str(run)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "epoch " in out and "AP50" in out
    names = {p.name for p in run.iterdir()}
    assert {"train_config.json", "checkpoint.safetensors", "model.safetensors", "history.json", "metrics.json",
            "losses.png", "ap.png"} <= names
    cfg = json.loads((run / "train_config.json").read_text())
    assert cfg["detector"] == "retinanet" and cfg["img_size"] == 128 and cfg["max_steps"] == 2
    hist = json.loads((run / "history.json").read_text())
    assert [s["step"] for s in hist["steps"]] == [1, 2] and {"classification", "bbox_regression"} <= set(hist["steps"][0])
    assert hist["epochs"][-1]["val"]["bbox"]["AP50"] is not None
    metrics = json.loads((run / "metrics.json").read_text())
    assert metrics["detections"] > 0 and metrics["images"] == 2 and "segm" not in metrics
    meta = read_metadata(run / "model.safetensors")
    assert [c["id"] for c in json.loads(meta["categories"])] == list(range(1, 11))

    assert cli.main(["eval", "--run", str(run), "--no-progress", "--json", str(tmp_path / "e.json")]) == 0
    again = json.loads((tmp_path / "e.json").read_text())
    assert again["bbox"] == metrics["bbox"]  # the same weights and images give the same numbers
    assert cli.main(["predict", "--run", str(run), str(scenes / "val" / "000000.png"), "--out", str(tmp_path / "p"),
                     "--score-threshold", "0"]) == 0
    assert (tmp_path / "p" / "000000.png").stat().st_size > 0
    assert json.loads((tmp_path / "p" / "predictions.json").read_text())


def test_mask_rcnn_two_steps_and_segm_metrics(scenes, tmp_path):
    run = tmp_path / "run"
    rc = cli.main(["train", "--data", str(scenes), "--detector", "maskrcnn", *SMALL, "--epochs", "1",
                   "--max-steps", "2", "--batch-size", "1", "--val-subset", "1", "--out", str(run)])
    assert rc == 0
    metrics = json.loads((run / "metrics.json").read_text())
    assert set(metrics) >= {"bbox", "segm"} and metrics["images"] == 1
    hist = json.loads((run / "history.json").read_text())
    assert {"loss_mask", "loss_objectness"} <= set(hist["steps"][-1])


def _step_of(path: Path) -> int | None:
    try:
        state = json.loads(read_metadata(path)["state"])
    except Exception:  # not written yet, or being replaced
        return None
    pos = dict(state["__items__"])["position"]
    return dict(pos["__items__"])["global_step"]


def test_killed_run_resumes_to_the_same_weights(scenes, tmp_path):
    args = ["train", "--data", str(scenes), "--detector", "retinanet", *SMALL, "--epochs", "2", "--batch-size", "1",
            "--eval-every", "0", "--train-subset", "3"]
    ref = tmp_path / "ref"
    assert cli.main([*args, "--out", str(ref)]) == 0  # 6 steps uninterrupted

    run = tmp_path / "killed"
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    proc = subprocess.Popen([sys.executable, "-m", "laplacianformer.detection", *args, "--out", str(run),
                             "--save-every-steps", "1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    ckpt, step, deadline = run / "checkpoint.safetensors", None, time.time() + 120
    while time.time() < deadline and proc.poll() is None:
        step = _step_of(ckpt) if ckpt.exists() else None
        if step is not None and step >= 2:
            proc.send_signal(signal.SIGKILL)
            break
        time.sleep(0.02)
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
    assert not (run / "model.safetensors").exists() and 2 <= _step_of(ckpt) < 6

    assert cli.main(["train", "--out", str(run), "--resume"]) == 0
    a, b = load_checkpoint(ref / "model.safetensors"), load_checkpoint(run / "model.safetensors")
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a), [k for k in a if not torch.equal(a[k], b[k])][:5]
    ha, hb = (json.loads((r / "history.json").read_text()) for r in (ref, run))
    assert [s["loss"] for s in ha["steps"]] == [s["loss"] for s in hb["steps"]]
