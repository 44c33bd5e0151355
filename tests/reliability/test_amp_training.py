"""Mixed-precision training: bf16 and fp16 (GradScaler) steps stay finite, and an fp16 run killed with
SIGKILL and resumed ends with the same weights as an uninterrupted one (the scaler state is restored).

The 200-step comparison of off / bf16 / fp16 is ``python -m laplacianformer.bench.amp_training``.
"""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

from laplacianformer.checkpoint import load_checkpoint
from laplacianformer.train import TrainConfig, train
from laplacianformer.train.engine import read_resume

TINY_MODEL = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [8, 16, 32, 32], "num_heads": [1, 1, 2, 2]}


def _config(out: Path, **kw) -> TrainConfig:
    base = dict(data="digits", img_size=16, train_subset=96, test_subset=32, epochs=1, batch_size=16,
                model_kwargs=dict(TINY_MODEL), out=str(out), progress=False, hflip=False, threads=1,
                verify_images=False)
    base.update(kw)
    return TrainConfig(**base)


def _losses(run_dir: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (run_dir / "log.jsonl").read_text().splitlines()]


@pytest.fixture
def restore_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_bf16_autocast_training_is_finite(tmp_path, restore_threads):
    result = train(_config(tmp_path / "bf16", amp="bf16", max_steps=4))
    assert result["steps"] == 4
    losses = _losses(tmp_path / "bf16")
    assert len(losses) == 4 and all(torch.isfinite(torch.tensor(losses)))
    weights = load_checkpoint(tmp_path / "bf16" / "model.safetensors")
    assert all(torch.isfinite(w).all() for w in weights.values())


def test_fp16_sigkill_and_resume_gives_identical_weights(tmp_path, restore_threads):
    steps = 6
    ref = train(_config(tmp_path / "ref", amp="fp16", max_steps=steps))
    assert ref["steps"] == steps and all(torch.isfinite(torch.tensor(_losses(tmp_path / "ref"))))
    cut = tmp_path / "cut"
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            train(_config(cut, amp="fp16", max_steps=steps, save_every_steps=2))
        finally:
            os._exit(0)
    deadline = time.monotonic() + 120
    while not (cut / "log.jsonl").exists() or len((cut / "log.jsonl").read_text().splitlines()) < 3:
        assert time.monotonic() < deadline, "the forked run logged fewer than 3 steps in 120 s"
        assert os.waitpid(pid, os.WNOHANG) == (0, 0), "the forked run ended before it was killed"
        time.sleep(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    assert not (cut / "model.safetensors").exists()
    saved = read_resume(cut / "checkpoint.safetensors").state
    assert saved["position"]["global_step"] in (2, 4) and saved["scaler"]["scale"] > 0
    resumed = train(resume=cut)
    assert resumed["steps"] == steps
    a = load_checkpoint(tmp_path / "ref" / "model.safetensors")
    b = load_checkpoint(cut / "model.safetensors")
    assert a.keys() == b.keys()
    for key in a:
        assert torch.equal(a[key], b[key]), key
    assert read_resume(cut).state["scaler"] == read_resume(tmp_path / "ref").state["scaler"]
