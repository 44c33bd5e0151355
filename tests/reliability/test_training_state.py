"""Training state files (``save_training_state`` / ``load_training_state``): exact round trip of nested
state, damaged files named in the error with what was expected, the fallback to ``<name>.prev``, and the
refusal of a ``save_checkpoint`` file (the training checkpoints of laplacianformer before 0.1)."""

from __future__ import annotations

import json
import math
import random

import numpy as np
import pytest
import torch

from laplacianformer.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_training_state,
    previous_path,
    read_metadata,
    save_checkpoint,
    save_training_state,
    save_weights,
)

FORMAT = "test.train/1"


def _model_and_state(step: int = 3) -> tuple[dict, dict]:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    scaler = torch.amp.GradScaler("cpu", enabled=True)
    for _ in range(2):
        model(torch.randn(3, 5)).sum().backward()
        opt.step()
    np.random.seed(step)
    random.seed(step)
    keys, pos, has_gauss, cached = np.random.get_state()[1:]
    version, py_state, gauss = random.getstate()
    state = {
        "optimizer": opt.state_dict(),  # int keys, tuple betas, 0-d float step tensors
        "scaler": scaler.state_dict(),
        "rng": {"torch": torch.get_rng_state(),
                "numpy": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos)},
                "python": {"version": version, "state": list(py_state), "gauss_next": gauss}},
        "history": [{"epoch": 1, "loss": 0.1 + 0.2, "top1": 1 / 3, "val": None}],
        "odd": {"inf": math.inf, "big": 2**62 + 1, "flag": True, "dtype": torch.bfloat16,
                "device": torch.device("cpu"), "size": torch.Size([2, 3]), "empty": torch.zeros(0, 4),
                "a/b": torch.ones(2), "a": {"b": torch.full((2,), 2.0)}, 7: "int key"},
    }
    return model.state_dict(), state


def _same_weights(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)  # the model's weights come back in name order
    for key in a:
        _assert_same(a[key], b[key])


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) or {type(a), type(b)} == {torch.Size, tuple}, (type(a), type(b))
        assert len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b and type(a) is type(b), (a, b)


def test_round_trip_is_exact_and_resumes_an_optimizer(tmp_path):
    model, state = _model_and_state()
    path = save_training_state(tmp_path / "c.safetensors", model, state, format=FORMAT, metadata={"run": "x"})
    loaded = load_training_state(path, format=FORMAT)
    _same_weights(loaded.model, model)
    _assert_same(loaded.state, state)
    assert loaded.path == path and loaded.metadata["run"] == "x" and loaded.metadata["format"] == FORMAT
    assert read_metadata(path)["run"] == "x"  # the metadata reads without the tensors
    # the optimizer state goes back into an optimizer and steps on exactly as the original would
    net = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4))
    net.load_state_dict(loaded.model)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-3, betas=(0.9, 0.99))
    opt.load_state_dict(loaded.state["optimizer"])
    assert opt.state_dict()["param_groups"] == state["optimizer"]["param_groups"]


def test_layout_tensors_under_model_and_state_the_rest_json(tmp_path):
    model, state = _model_and_state()
    path = save_training_state(tmp_path / "c.safetensors", model, state, format=FORMAT)
    tensors = load_checkpoint(path)  # a plain safetensors file
    assert {k for k in tensors if k.startswith("model/")} == {f"model/{k}" for k in model}
    assert all(k.startswith(("model/", "state/")) for k in tensors)
    assert "state/optimizer/state/0/exp_avg" in tensors
    json.loads(read_metadata(path)["state"])


def test_bad_content_is_refused_before_any_io(tmp_path):
    model, _ = _model_and_state()
    with pytest.raises(TypeError, match=r"state\['x'\]\['f'\]"):
        save_training_state(tmp_path / "c.safetensors", model, {"x": {"f": print}}, format=FORMAT)
    with pytest.raises(ValueError, match="reserved"):
        save_training_state(tmp_path / "c.safetensors", model, {}, format=FORMAT, metadata={"state": "x"})
    with pytest.raises(TypeError, match="format"):
        save_training_state(tmp_path / "c.safetensors", model, {}, format="")
    assert list(tmp_path.iterdir()) == []


def test_wrong_format_and_plain_weights_are_named(tmp_path):
    model, state = _model_and_state()
    path = save_training_state(tmp_path / "c.safetensors", model, state, format="other/1")
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {path}: not a '{FORMAT}' training checkpoint \(its format is 'other/1'\)"):
        load_training_state(path, format=FORMAT)
    weights = save_weights(model, tmp_path / "w.safetensors")
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {weights}: not a training checkpoint"):
        load_training_state(weights)


@pytest.mark.parametrize("damage,problem", [
    (lambda b: b[: len(b) // 2], "truncated"),
    (lambda b: b[:5], "shorter than the 8-byte"),
    (lambda b: b[:-1] + bytes([b[-1] ^ 1]), "hash mismatch"),
    (lambda b: b"", "empty file"),
])
def test_damaged_file_names_itself_and_falls_back_to_prev(tmp_path, damage, problem):
    path = tmp_path / "checkpoint.safetensors"
    model1, state1 = _model_and_state(1)
    model2, state2 = _model_and_state(2)
    save_training_state(path, model1, state1, format=FORMAT)
    save_training_state(path, model2, state2, format=FORMAT)
    assert previous_path(path).exists()
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {path}: .*{problem}"):
        load_training_state(path, format=FORMAT)
    with pytest.warns(RuntimeWarning, match=rf"{problem}.*loaded the previous checkpoint {previous_path(path)}"):
        loaded = load_training_state(path, format=FORMAT, fallback_previous=True)
    assert loaded.path == previous_path(path)
    _assert_same(loaded.state, state1)
    # both damaged: one error naming both files
    previous_path(path).write_bytes(previous_path(path).read_bytes()[:100])
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {path}: .*no fallback: checkpoint: {previous_path(path)}: "):
        load_training_state(path, format=FORMAT, fallback_previous=True)


def test_missing_latest_falls_back_only_when_asked(tmp_path):
    path = tmp_path / "checkpoint.safetensors"
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {path}: missing"):
        load_training_state(path, fallback_previous=True)


def test_safetensors_prev_loads_through_load_checkpoint(tmp_path):
    """``<name>.safetensors.prev`` is a safetensors file (it used to be read as a torch.save file)."""
    path = tmp_path / "w.safetensors"
    save_weights({"w": torch.ones(3)}, path, keep_previous=True)
    save_weights({"w": torch.zeros(3)}, path, keep_previous=True)
    assert torch.equal(load_checkpoint(previous_path(path))["w"], torch.ones(3))
    path.write_bytes(path.read_bytes()[:20])
    with pytest.warns(RuntimeWarning, match="previous checkpoint"):
        assert torch.equal(load_checkpoint(path, fallback_previous=True)["w"], torch.ones(3))


def test_a_save_checkpoint_file_is_refused_unread(tmp_path):
    """A ``save_checkpoint`` file holding ``{"format", "model", ...}`` (classification checkpoints before
    0.1) is not a training checkpoint: refused by its name, before any unpickling."""
    model, state = _model_and_state()
    path = save_checkpoint({"format": FORMAT, "model": model, **state}, tmp_path / "checkpoint.pt")
    with pytest.raises(CheckpointError, match=rf"^checkpoint: {path}: not a training checkpoint \(save_training_state "
                                              r"writes \.safetensors files\)"):
        load_training_state(path, format=FORMAT)
