"""The run directory's training checkpoint (docs/TRAINING.md "Checkpoints, interruption and resuming"):
``checkpoint.safetensors`` written atomically with a ``.prev``; a damaged latest file falls back to the
previous one with a warning, or fails naming the file; a run of laplacianformer before 0.1, which holds
its training state in ``checkpoint.pt``, is refused with an error that says what to do."""

from __future__ import annotations

import shutil
import signal

import pytest
import torch

import laplacianformer
from laplacianformer.checkpoint import CheckpointError, load_checkpoint, read_metadata, save_checkpoint
from laplacianformer.hub import write_config
from laplacianformer.train import Trainer, train
from laplacianformer.train.engine import read_resume
from laplacianformer.train.evaluate_run import evaluate_checkpoint

from train_helpers import tiny_config

SETTINGS = dict(train_subset=128, test_subset=32, epochs=2, ema=True, mixup=0.8, drop_path=0.1)  # 8 steps


def _interrupt_after(monkeypatch, steps: int) -> None:
    """SIGINT to this process after ``steps`` optimiser steps (the loop checkpoints and returns)."""
    step = Trainer._train_step

    def train_step(self, images, labels):
        out = step(self, images, labels)
        if self.global_step + 1 == steps:
            signal.raise_signal(signal.SIGINT)
        return out

    monkeypatch.setattr(Trainer, "_train_step", train_step)


def _same_file_weights(a, b) -> None:
    wa, wb = load_checkpoint(a), load_checkpoint(b)
    assert wa.keys() == wb.keys()
    for k in wa:
        assert torch.equal(wa[k], wb[k]), k


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("ref") / "run"
    train(tiny_config(out, **SETTINGS))
    return out


def test_checkpoint_is_one_safetensors_file_with_a_previous_copy(reference):
    names = {p.name for p in reference.iterdir()}
    assert {"checkpoint.safetensors", "checkpoint.safetensors.prev"} <= names
    assert not any(n.startswith("checkpoint.pt") or n.endswith(".tmp") for n in names)
    meta = read_metadata(reference / "checkpoint.safetensors")
    assert meta["format"] == "laplacianformer.train/1" and meta["model"] == "laplacianformer_micro"
    path, state = read_resume(reference)
    assert path == reference / "checkpoint.safetensors" and state["position"]["global_step"] == 8
    assert read_resume(reference / "checkpoint.safetensors.prev").state["position"]["global_step"] == 4


def test_a_checkpoint_pt_run_of_before_0_1_is_refused_saying_what_to_do(tmp_path):
    """``checkpoint.pt`` (torch.save + integrity trailer) is never read: resume, eval and from_pretrained
    name the file and what to do."""
    run = tmp_path / "old"
    run.mkdir()
    save_checkpoint({"format": "laplacianformer.train/1", "model": {"w": torch.ones(1)}}, run / "checkpoint.pt")
    (run / "train_config.json").write_text("{}")
    write_config(laplacianformer.create_model("laplacianformer_micro"), run)
    what = rf"^checkpoint: {run / 'checkpoint.pt'}: .* before 0\.1, no longer read: retrain, or .*save_pretrained"
    for target in (run, run / "checkpoint.pt"):
        with pytest.raises(CheckpointError, match=what):
            read_resume(target)
        with pytest.raises(CheckpointError, match=what):
            evaluate_checkpoint(target, progress=False)
    with pytest.raises(CheckpointError, match=what):
        laplacianformer.from_pretrained(run)


def test_damaged_latest_checkpoint_falls_back_to_prev_and_resumes(reference, tmp_path, monkeypatch):
    cut = tmp_path / "cut"
    with monkeypatch.context() as m:
        _interrupt_after(m, 6)
        assert train(tiny_config(cut, save_every_steps=5, **SETTINGS))["interrupted"] == "SIGINT"
    latest, prev = cut / "checkpoint.safetensors", cut / "checkpoint.safetensors.prev"
    assert read_resume(prev).state["position"]["global_step"] == 5
    latest.write_bytes(latest.read_bytes()[:-1000])  # a torn write the atomic rename would prevent
    with pytest.warns(RuntimeWarning, match=rf"{latest}: .*truncated.*loaded the previous checkpoint {prev}"):
        resumed = train(resume=cut)
    assert resumed["steps"] == 8
    for name in ("model.safetensors", "model_ema.safetensors"):
        _same_file_weights(reference / name, cut / name)


def test_no_usable_checkpoint_names_every_file_tried(reference, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(reference, bad)
    (bad / "checkpoint.safetensors").write_bytes(b"\x00" * 7)
    (bad / "checkpoint.safetensors.prev").write_bytes(b"")
    with pytest.raises(CheckpointError) as info:
        read_resume(bad)
    msg = str(info.value)
    assert msg.startswith(f"checkpoint: {bad / 'checkpoint.safetensors'}: ") and "shorter than the 8-byte" in msg
    assert f"no fallback: checkpoint: {bad / 'checkpoint.safetensors.prev'}: empty file" in msg
    # no checkpoint at all
    for f in ("checkpoint.safetensors", "checkpoint.safetensors.prev"):
        (bad / f).unlink()
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {bad / 'checkpoint.safetensors'}: no such file "
                                              r"\(expected a run directory or a checkpoint file\)"):
        read_resume(bad)
