"""The run directory's training checkpoint (docs/TRAINING.md "Checkpoints, interruption and resuming"):
``checkpoint.safetensors`` written atomically with a ``.prev``; a damaged latest file falls back to the
previous one with a warning, or fails naming the file; a run interrupted by the code before it, which
holds only a legacy ``checkpoint.pt``, still resumes to the weights of an uninterrupted run, evaluates
and loads with ``from_pretrained``."""

from __future__ import annotations

import shutil
import signal

import pytest
import torch

import laplacianformer
from laplacianformer.checkpoint import CheckpointError, load_checkpoint, read_metadata, save_checkpoint
from laplacianformer.train import Trainer, train
from laplacianformer.train.distributed import barrier
from laplacianformer.train.engine import read_resume
from laplacianformer.train.evaluate_run import evaluate_checkpoint

from train_helpers import tiny_config

SETTINGS = dict(train_subset=128, test_subset=32, epochs=2, ema=True, mixup=0.8, drop_path=0.1)  # 8 steps


def _legacy_save(self) -> None:
    """``Trainer.save`` before checkpoint.safetensors: ``save_checkpoint`` (torch.save + integrity trailer)."""
    if self.dist.is_main:
        save_checkpoint(self.state_dict(), self.run_dir / "checkpoint.pt")
    barrier(self.dist)


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


def test_a_legacy_checkpoint_pt_run_resumes_evaluates_and_loads(reference, tmp_path, monkeypatch):
    cut = tmp_path / "legacy"
    with monkeypatch.context() as m:
        m.setattr(Trainer, "save", _legacy_save)
        _interrupt_after(m, 3)
        assert train(tiny_config(cut, **SETTINGS))["interrupted"] == "SIGINT"
    assert (cut / "checkpoint.pt").exists() and not (cut / "checkpoint.safetensors").exists()
    legacy = load_checkpoint(cut / "checkpoint.pt")
    assert legacy["position"]["global_step"] == 3

    # from_pretrained: no best or last weights yet, so the model in checkpoint.pt
    model = laplacianformer.from_pretrained(cut)
    assert all(torch.equal(v, legacy["model"][k]) for k, v in model.state_dict().items())
    # eval of the run directory and of the file itself
    for target in (cut, cut / "checkpoint.pt"):
        res = evaluate_checkpoint(target, test_subset=32, progress=False, out=tmp_path / "eval")
        assert res["checkpoint"] == str(cut / "checkpoint.pt") and res["n"] == 32
    res = evaluate_checkpoint(cut / "checkpoint.pt", ema=True, test_subset=32, progress=False, out=tmp_path / "eval")
    assert res["n"] == 32

    # resume: same weights as the uninterrupted run; the new checkpoint is safetensors, checkpoint.pt stays
    before = (cut / "checkpoint.pt").read_bytes()
    resumed = train(resume=cut)
    assert resumed["steps"] == 8 and resumed["interrupted"] is None
    for name in ("model.safetensors", "model_ema.safetensors", "model_best.safetensors"):
        _same_file_weights(reference / name, cut / name)
    assert read_resume(cut).path == cut / "checkpoint.safetensors"
    assert (cut / "checkpoint.pt").read_bytes() == before


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
    with pytest.raises(CheckpointError, match=r"no such file \(expected a run directory or a checkpoint file, or "
                                              r"checkpoint\.pt"):
        read_resume(bad)
