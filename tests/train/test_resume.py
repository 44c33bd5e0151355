"""Checkpoint/resume (issue 4.3): SIGINT checkpoints at a step boundary and exits cleanly; a run then killed
with SIGKILL and resumed again ends with exactly the same weights (and EMA, curves, step log) as an
uninterrupted run. Mixup/CutMix, drop path and EMA are on so every RNG and state path is exercised."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import torch

from laplacianformer.checkpoint import load_checkpoint
from laplacianformer.train.engine import read_resume

from train_helpers import cli_env, run_cli, tiny_cli_args

ARGS = ("--epochs", "2", "--save-every-steps", "2", "--attn", "laplacian", "--drop-path", "0.1",
        "--mixup", "0.8", "--cutmix", "1.0", "--ema")
TOTAL = 16


def _steps_logged(run_dir):
    log = run_dir / "log.jsonl"
    return len(log.read_text().splitlines()) if log.exists() else 0


def _popen(args):
    return subprocess.Popen([sys.executable, "-m", "laplacianformer", *args], env=cli_env(),
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _signal_at(proc, run_dir, step, sig):
    deadline = time.monotonic() + 120
    while _steps_logged(run_dir) < step:
        assert proc.poll() is None, f"run ended before step {step}: {proc.stderr.read()}"
        assert time.monotonic() < deadline
        time.sleep(0.01)
    proc.send_signal(sig)
    return proc.wait(timeout=60)


def test_sigint_then_sigkill_then_resume_gives_identical_weights(tmp_path):
    ref_dir, cut_dir = tmp_path / "ref", tmp_path / "cut"
    ref = _popen(tiny_cli_args(ref_dir, *ARGS))
    cut = _popen(tiny_cli_args(cut_dir, *ARGS))

    rc = _signal_at(cut, cut_dir, 3, signal.SIGINT)
    err = cut.stderr.read()
    assert rc == 128 + signal.SIGINT, err
    assert "Traceback" not in err and "--resume" in err
    assert read_resume(cut_dir / "checkpoint.safetensors").state["position"]["global_step"] == _steps_logged(cut_dir)

    again = _popen(["train", "--resume", str(cut_dir)])
    assert _signal_at(again, cut_dir, 11, signal.SIGKILL) == -signal.SIGKILL
    assert not (cut_dir / "model.safetensors").exists()
    saved = read_resume(cut_dir / "checkpoint.safetensors").state["position"]
    assert saved["epoch"] == 1 and saved["step"] >= 2

    done = run_cli(["train", "--resume", str(cut_dir)])
    assert done.returncode == 0, done.stderr
    assert ref.wait(timeout=120) == 0, ref.stderr.read()
    for name in ("model.safetensors", "model_ema.safetensors"):
        a, b = load_checkpoint(ref_dir / name), load_checkpoint(cut_dir / name)
        assert a.keys() == b.keys()
        for k in a:
            assert torch.equal(a[k], b[k]), (name, k)
    ha = json.loads((ref_dir / "epochs.json").read_text())
    hb = json.loads((cut_dir / "epochs.json").read_text())
    assert [r["test_loss"] for r in ha] == [r["test_loss"] for r in hb]
    assert [r["train_loss"] for r in ha] == [r["train_loss"] for r in hb]
    steps = [json.loads(line)["step"] for line in (cut_dir / "log.jsonl").read_text().splitlines()]
    assert steps == list(range(1, TOTAL + 1))
