"""The CLI reports damaged, hostile or missing checkpoints and bad flags as one line, exit status 2."""

from __future__ import annotations

import hashlib
import io

import pytest
import torch

from laplacianformer import checkpoint as ckpt
from laplacianformer.checkpoint import save_checkpoint, save_weights
from laplacianformer.cli import main


class _Marker:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


@pytest.fixture
def files(tmp_path):
    save_checkpoint({"format": "anything"}, tmp_path / "trunc.pt")
    data = (tmp_path / "trunc.pt").read_bytes()
    (tmp_path / "trunc.pt").write_bytes(data[: len(data) // 2])
    buffer = io.BytesIO()
    torch.save({"model": _Marker(tmp_path / "PWNED")}, buffer)
    payload = buffer.getvalue()
    trailer = ckpt._TRAILER.pack(ckpt._MAGIC, len(payload), hashlib.sha256(payload).digest(), ckpt._MAGIC)
    (tmp_path / "evil.pt").write_bytes(payload + trailer)
    save_weights({"w": torch.ones(8)}, tmp_path / "w.safetensors")
    flipped = bytearray((tmp_path / "w.safetensors").read_bytes())
    flipped[-3] ^= 4
    (tmp_path / "flip.safetensors").write_bytes(bytes(flipped))
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "checkpoint.pt").write_bytes(b"")
    return tmp_path


CASES = [
    (["train", "--resume", "{d}/trunc.pt"], "checkpoint: {d}/trunc.pt: ", "not a training checkpoint"),
    (["train", "--resume", "{d}/evil.pt"], "checkpoint: {d}/evil.pt: ", "not a training checkpoint"),
    (["eval", "--checkpoint", "{d}/evil.pt"], "checkpoint: {d}/evil.pt: ", "refused pickle"),  # a weights file, unpickled weights_only
    (["eval", "--checkpoint", "{d}/flip.safetensors"], "checkpoint: {d}/flip.safetensors: ", "hash mismatch"),
    (["train", "--resume", "{d}/run"], "checkpoint: {d}/run/checkpoint.pt: ", "before 0.1, no longer read: retrain"),
    (["eval", "--checkpoint", "{d}/run"], "checkpoint: {d}/run/checkpoint.pt: ", "before 0.1, no longer read: retrain"),
    (["train", "--resume", "{d}/missing"], "checkpoint: {d}/missing: ", "no such file"),
    (["train", "--amp", "fp8"], "argument --amp: ", "fp8"),
    (["train", "--epochs", "0"], "argument --epochs: ", ">= 1"),
    (["train", "--model-kwargs", "[1]"], "argument --model-kwargs: ", "JSON object"),
]


@pytest.mark.parametrize(("argv", "prefix", "problem"), CASES)
def test_one_line_error_and_status_2(files, capsys, argv, prefix, problem):
    d = str(files)
    assert main([a.format(d=d) for a in argv]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith(f"laplacianformer: error: {prefix.format(d=d)}"), err
    assert problem in err, err
    assert not (files / "PWNED").exists()
