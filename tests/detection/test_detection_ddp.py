"""``detect train`` under torchrun with two CPU processes (gloo): one shard per rank, gathered evaluation."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from laplacianformer.detection import cli

SRC = Path(__file__).resolve().parents[2] / "src"


def test_two_process_training_gathers_every_ranks_detections(scenes, tmp_path):
    run = tmp_path / "ddp"
    env = dict(os.environ, PYTHONPATH=str(SRC), OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
           "-m", "laplacianformer.detection", "train", "--data", str(scenes), "--backbone", "laplacianformer_micro",
           "--img-size", "128", "--fpn-channels", "32", "--threads", "1", "--no-progress", "--epochs", "1",
           "--batch-size", "1", "--max-steps", "2", "--score-thresh", "0", "--out", str(run)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.count("epoch ") == 1 and proc.stdout.count("AR100") == 1  # rank 0 alone prints
    metrics = json.loads((run / "metrics.json").read_text())
    hist = json.loads((run / "history.json").read_text())
    assert [s["step"] for s in hist["steps"]] == [1, 2]
    assert hist["epochs"][-1]["images_per_s"] > 0
    # both val images were predicted (one per rank) and gathered before COCOeval: a single-process
    # evaluation of the same weights gives the same numbers
    assert metrics["images"] == 2 and metrics["detections"] > 100
    assert cli.main(["eval", "--run", str(run), "--no-progress", "--json", str(tmp_path / "single.json")]) == 0
    single = json.loads((tmp_path / "single.json").read_text())
    assert single["bbox"] == metrics["bbox"] and single["detections"] == metrics["detections"]
