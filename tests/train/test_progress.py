"""The time-based progress line (``train/progress.py``) with an injected clock, and its use by ``train`` and
``eval`` when stderr is not a terminal (pytest's capture is not one)."""

from __future__ import annotations

import io

import pytest
import torch

from laplacianformer.data import TensorImageDataset
from laplacianformer.train import evaluate, train
from laplacianformer.train.progress import ENV_EVERY, ProgressLine, format_duration, interval, progress_mode

from train_helpers import tiny_config


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_a_line_every_30_s_with_rate_mean_loss_and_eta():
    clock, lines = Clock(), []
    p = ProgressLine("train", 100, clock=clock, write=lines.append, every=30)
    for _ in range(9):  # 9 steps in 29 s: nothing yet
        clock.t += 29 / 9
        assert p.update(images=32, loss=2.0, note="epoch 1/2") is None
    clock.t += 1.0  # step 10 at 30 s
    line = p.update(images=32, loss=1.0, note="epoch 1/2")
    assert lines == [line]
    assert line == "train  step 10/100  epoch 1/2  10.7 img/s  loss 1.9000  ETA 4:30"
    clock.t += 60.0  # the window restarts: one step of 64 images in 60 s
    # ETA at the rate since the start: 89 steps to go at 11 steps per 90 s
    assert p.update(images=64, loss=0.5) == "train  step 11/100  1.1 img/s  loss 0.5000  ETA 12:08"


def test_resumed_counts_eta_from_the_steps_of_this_session_and_disabled_writes_nothing():
    clock, lines = Clock(), []
    p = ProgressLine("detect train", 50, start=40, clock=clock, write=lines.append, every=30)
    clock.t += 30.0
    assert p.update(5, images=40) == "detect train  step 45/50  1.3 img/s  ETA 0:30"  # 5 steps in 30 s, 5 to go
    clock.t += 30.0
    assert p.update(5) == "detect train  step 50/50"  # done: no ETA, no images counted
    off = ProgressLine("eval", 3, clock=clock, write=lines.append, enabled=False)
    clock.t += 1000.0
    assert off.update(images=8, loss=1.0) is None and len(lines) == 2


def test_mode_duration_and_interval(monkeypatch):
    class Tty(io.StringIO):
        def isatty(self):
            return True

    assert progress_mode(True, Tty()) == "bars" and progress_mode(True, io.StringIO()) == "lines"
    assert progress_mode("lines", Tty()) == "lines" and progress_mode(False) == progress_mode(None) == "off"
    with pytest.raises(ValueError, match="^progress: "):
        progress_mode("yes")
    assert [format_duration(s) for s in (0, 59.6, 61, 3600 + 62)] == ["0:00", "1:00", "1:01", "1:01:02"]
    monkeypatch.delenv(ENV_EVERY, raising=False)
    assert interval() == 30.0
    monkeypatch.setenv(ENV_EVERY, "2.5")
    assert interval() == 2.5
    monkeypatch.setenv(ENV_EVERY, "0")
    with pytest.raises(ValueError, match=f"^{ENV_EVERY}: expected a number of seconds > 0, got '0'"):
        interval()


def test_train_and_eval_print_timed_lines_without_a_terminal(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv(ENV_EVERY, "1e-9")  # a line at every step: the 30 s rule without waiting 30 s
    r = train(tiny_config(tmp_path / "run", train_subset=64, test_subset=32))  # progress=False: no bars either
    err = capsys.readouterr().err.splitlines()
    steps = [line for line in err if line.startswith("train  step ")]
    assert [line.split()[2] for line in steps] == ["1/2", "2/2"], err
    assert "epoch 1/1" in steps[0] and "img/s" in steps[0] and "loss " in steps[0] and "ETA " in steps[0]
    assert r["steps"] == 2 and any(line.startswith("eval 1  batch ") for line in err)  # the epoch's evaluation

    data = TensorImageDataset(torch.zeros(5, 1, 16, 16, dtype=torch.uint8), torch.zeros(5, dtype=torch.long),
                              ["a", "b"], (0.5,), (0.5,))
    model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(256, 2))
    evaluate(model, data, batch_size=2, progress=True)  # True: bars on a terminal, lines here
    lines = capsys.readouterr().err.splitlines()
    assert [line.split("  ")[1] for line in lines] == ["batch 1/3", "batch 2/3", "batch 3/3"], lines
    evaluate(model, data, batch_size=2, progress=False)
    assert capsys.readouterr().err == ""
