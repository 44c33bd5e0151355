"""Checkpoint safety: round trip, refused pickles, corruption detection, crash and disk-full behaviour."""

from __future__ import annotations

import errno
import io
import os
import pickle
import random
import signal
import time
import warnings
from pathlib import Path

import pytest
import torch

from fault_cases import slow_saving_loop

from laplacianformer import checkpoint as ckpt
from laplacianformer.checkpoint import (
    TRAILER_SIZE,
    CheckpointError,
    load_checkpoint,
    previous_path,
    read_metadata,
    save_checkpoint,
    save_weights,
)


def _training_state(step: int = 7) -> dict:
    torch.manual_seed(step)
    model = torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.LayerNorm(4))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.99))
    model(torch.randn(3, 5)).sum().backward()
    opt.step()
    return {
        "model": model.state_dict(),
        "optimizer": opt.state_dict(),
        "step": step,
        "best": 0.5,
        "config": {"name": "micro", "landmarks": (7, 7), "tie_qk": False, "ema": None},
        "rng": torch.get_rng_state(),
        "dtype": torch.bfloat16,
    }


def _assert_same(a, b) -> None:
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    elif isinstance(a, dict):
        assert list(a) == list(b)
        for key in a:
            _assert_same(a[key], b[key])
    elif isinstance(a, (list, tuple)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _assert_same(x, y)
    else:
        assert a == b and type(a) is type(b)


class _Marker:
    """Unpickling this would create a file: the payload a malicious checkpoint would carry."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _with_trailer(payload: bytes) -> bytes:
    import hashlib

    return payload + ckpt._TRAILER.pack(ckpt._MAGIC, len(payload), hashlib.sha256(payload).digest(), ckpt._MAGIC)


def test_round_trip_training_state(tmp_path):
    state = _training_state()
    path = save_checkpoint(state, tmp_path / "run.pt")
    assert path == tmp_path / "run.pt"
    _assert_same(state, load_checkpoint(path))
    _assert_same(state["model"], torch.load(path, weights_only=True)["model"])
    assert not previous_path(path).exists()
    newer = _training_state(8)
    save_checkpoint(newer, path)
    _assert_same(newer, load_checkpoint(path))
    _assert_same(state, load_checkpoint(previous_path(path)))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["run.pt", "run.pt.prev"]


def test_keep_previous_false_does_not_rotate(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"a": 1}, path, keep_previous=False)
    save_checkpoint({"a": 2}, path, keep_previous=False)
    assert load_checkpoint(path) == {"a": 2}
    assert not previous_path(path).exists()


@pytest.mark.parametrize(
    ("obj", "where"),
    [
        ({"a": {"b": [1, object()]}}, "obj['a']['b'][1]"),
        ({"sched": {"fn": len}}, "obj['sched']['fn']"),
        ({"x": {1.5: torch.ones(1)}}, "obj['x']: dict keys"),
        ({"s": {1, 2}}, "obj['s']"),
        ({"m": _Marker(Path("never"))}, "obj['m']"),
    ],
)
def test_non_weights_only_content_is_rejected_before_writing(tmp_path, obj, where):
    with pytest.raises(TypeError) as info:
        save_checkpoint(obj, tmp_path / "c.pt")
    assert str(info.value).startswith(where)
    assert list(tmp_path.iterdir()) == []


def test_top_level_must_be_a_dict(tmp_path):
    with pytest.raises(TypeError, match=r"^obj: expected a dict"):
        save_checkpoint([torch.ones(1)], tmp_path / "c.pt")


@pytest.mark.parametrize("legacy", [False, True])
@pytest.mark.parametrize("trailer", [True, False])
def test_malicious_pickle_is_refused_and_never_runs(tmp_path, legacy, trailer):
    marker = tmp_path / "pwned"
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2), "evil": _Marker(marker)}, buffer, _use_new_zipfile_serialization=not legacy)
    payload = buffer.getvalue()
    path = tmp_path / "evil.pt"
    path.write_bytes(_with_trailer(payload) if trailer else payload)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path, verify=trailer)
    message = str(info.value)
    assert message.startswith(f"checkpoint: {path}: refused pickle")
    assert not marker.exists()


@pytest.mark.filterwarnings("ignore:Detected pickle protocol")
def test_raw_pickle_is_refused(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "raw.pkl"
    path.write_bytes(_with_trailer(pickle.dumps({"evil": _Marker(marker)})))
    with pytest.raises(CheckpointError, match=r"^checkpoint: .*raw\.pkl: "):
        load_checkpoint(path)
    assert not marker.exists()


def test_truncation_is_detected_at_every_cut(tmp_path):
    path = save_checkpoint(_training_state(), tmp_path / "c.pt")
    data = path.read_bytes()
    cuts = sorted({1, TRAILER_SIZE - 1, TRAILER_SIZE, len(data) // 2, len(data) - TRAILER_SIZE, len(data) - 1}
                  | set(random.Random(0).sample(range(2, len(data) - 1), 20)))
    for cut in cuts:
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"^checkpoint: .*(truncated|no integrity trailer)"):
            load_checkpoint(path)


def test_bit_flips_are_detected(tmp_path):
    path = save_checkpoint(_training_state(), tmp_path / "c.pt")
    data = bytearray(path.read_bytes())
    rng = random.Random(1)
    for pos in rng.sample(range(len(data)), 24):
        flipped = bytearray(data)
        flipped[pos] ^= 1 << rng.randrange(8)
        path.write_bytes(bytes(flipped))
        with pytest.raises(CheckpointError, match=r"^checkpoint: .*(hash mismatch|truncated|no integrity trailer)"):
            load_checkpoint(path)
    path.write_bytes(bytes(data) + b"\0")
    with pytest.raises(CheckpointError, match="no integrity trailer"):
        load_checkpoint(path)


@pytest.mark.parametrize(
    ("content", "problem"),
    [(None, "missing"), (b"", "empty"), (b"hello world" * 10, "no integrity trailer"), ("dir", "directory")],
)
def test_unreadable_files_name_path_and_problem(tmp_path, content, problem):
    path = tmp_path / "c.pt"
    if content == "dir":
        path.mkdir()
    elif content is not None:
        path.write_bytes(content)
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    assert str(info.value).startswith(f"checkpoint: {path}: ")
    assert problem in str(info.value)


def test_garbage_with_valid_trailer_is_not_a_checkpoint(tmp_path):
    path = tmp_path / "c.pt"
    path.write_bytes(_with_trailer(b"\x00garbage" * 50))
    with pytest.raises(CheckpointError, match=r"^checkpoint: .*not a"):
        load_checkpoint(path)


def test_non_dict_top_level_is_wrong_format(tmp_path):
    buffer = io.BytesIO()
    torch.save([torch.ones(1)], buffer)
    path = tmp_path / "c.pt"
    path.write_bytes(_with_trailer(buffer.getvalue()))
    with pytest.raises(CheckpointError, match="wrong format"):
        load_checkpoint(path)


def test_plain_torch_save_needs_verify_false(tmp_path):
    path = tmp_path / "plain.pt"
    torch.save({"w": torch.arange(3)}, path)
    with pytest.raises(CheckpointError, match="verify=False"):
        load_checkpoint(path)
    assert torch.equal(load_checkpoint(path, verify=False)["w"], torch.arange(3))


def test_fallback_previous_only_when_asked_and_loudly(tmp_path):
    path = tmp_path / "c.pt"
    save_checkpoint({"step": 1}, path)
    save_checkpoint({"step": 2}, path)
    path.write_bytes(path.read_bytes()[:-10])
    with pytest.raises(CheckpointError):
        load_checkpoint(path)
    with pytest.warns(RuntimeWarning, match=r"c\.pt\.prev"):
        assert load_checkpoint(path, fallback_previous=True) == {"step": 1}
    previous_path(path).write_bytes(b"")
    with pytest.raises(CheckpointError, match="fallback also failed.*empty"):
        load_checkpoint(path, fallback_previous=True)


def test_safetensors_round_trip_metadata_and_tied_weights(tmp_path):
    shared = torch.randn(4, 3)
    weights = {"a": shared, "b": shared, "c": torch.arange(5, dtype=torch.int64), "d": torch.randn(2, 3).t()}
    path = save_weights(weights, tmp_path / "w.safetensors", {"arch": "laplacianformer_tiny"})
    loaded = load_checkpoint(path)
    assert set(loaded) == set(weights)
    for key in weights:
        assert torch.equal(loaded[key], weights[key])
    assert read_metadata(path) == {"arch": "laplacianformer_tiny"}


def test_safetensors_corruption_is_detected(tmp_path):
    path = save_weights({"a": torch.randn(64), "b": torch.randn(8, 8)}, tmp_path / "w.safetensors")
    data = path.read_bytes()
    flipped = bytearray(data)
    flipped[-5] ^= 0x10
    path.write_bytes(bytes(flipped))
    with pytest.raises(CheckpointError, match="hash mismatch"):
        load_checkpoint(path)
    for cut in (4, 20, len(data) - 1):
        path.write_bytes(data[:cut])
        with pytest.raises(CheckpointError, match=r"^checkpoint: .*w\.safetensors: "):
            load_checkpoint(path)


def test_safetensors_bad_input_names_the_argument(tmp_path):
    with pytest.raises(TypeError, match=r"^state_dict\['x'\]"):
        save_weights({"x": 1.0}, tmp_path / "w.safetensors")
    with pytest.raises(TypeError, match=r"^metadata\['k'\]"):
        save_weights({"x": torch.ones(1)}, tmp_path / "w.safetensors", {"k": 3})
    with pytest.raises(ValueError, match=r"^metadata: .*reserved"):
        save_weights({"x": torch.ones(1)}, tmp_path / "w.safetensors", {"laplacianformer.sha256": "0"})


@pytest.mark.parametrize("where", ["write", "fsync"])
def test_disk_full_is_reported_and_previous_survives(tmp_path, monkeypatch, where):
    path = tmp_path / "c.pt"
    old = _training_state(1)
    save_checkpoint(old, path)
    if where == "write":
        def failing(f, data):
            f.write(bytes(memoryview(data)[: len(data) // 2]))
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt, "_write_payload", failing)
    else:
        def failing(fd):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        monkeypatch.setattr(ckpt.os, "fsync", failing)
    with pytest.raises(OSError) as info:
        save_checkpoint(_training_state(2), path)
    monkeypatch.undo()
    assert info.value.errno == errno.ENOSPC
    assert str(info.value).startswith(f"[Errno {errno.ENOSPC}] checkpoint: {path}: write failed")
    _assert_same(old, load_checkpoint(path))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def _in_child(fn, *args) -> str:
    """Run ``fn(*args)`` in a forked child (one torch thread: fork after OpenMP start-up needs it); its return text."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            os.close(read_fd)
            torch.set_num_threads(1)
            os.write(write_fd, fn(*args).encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_fd)
    with os.fdopen(read_fd) as pipe:
        text = pipe.read()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, text
    return text


def _save_over_file_size_limit(path: Path) -> str:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        save_checkpoint({"w": torch.ones(1_000_000)}, path)
    except OSError as exc:
        return f"ERRNO {exc.errno} {exc}"
    return "saved"


@pytest.mark.skipif(not hasattr(signal, "SIGXFSZ"), reason="needs RLIMIT_FSIZE")
def test_real_write_failure_from_the_kernel(tmp_path):
    """RLIMIT_FSIZE makes the kernel fail write(2) with EFBIG part-way: a real short write, not a mock."""
    path = tmp_path / "c.pt"
    save_checkpoint({"w": torch.zeros(16)}, path)
    out = _in_child(_save_over_file_size_limit, path)
    assert out.startswith(f"ERRNO {errno.EFBIG} [Errno {errno.EFBIG}] checkpoint: {path}: write failed"), out
    assert torch.equal(load_checkpoint(path)["w"], torch.zeros(16))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.pt"]


def test_sigkill_during_save_never_corrupts_the_latest_checkpoint(tmp_path):
    rng = random.Random(2)
    trials, mid_write = 8, 0
    for trial in range(trials):
        path = tmp_path / f"t{trial}" / "c.pt"
        path.parent.mkdir()
        save_checkpoint({"step": 0, "w": torch.zeros(1 << 20)}, path)
        pid = os.fork()
        if pid == 0:
            try:
                slow_saving_loop(path, 0.004)
            finally:
                os._exit(1)
        time.sleep(rng.uniform(0.05, 0.4))
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        latest = load_checkpoint(path)
        assert torch.equal(latest["w"], torch.full((1 << 20,), float(latest["step"])))
        if previous_path(path).exists():
            prev = load_checkpoint(previous_path(path))
            assert prev["step"] in (latest["step"] - 1, latest["step"])
        mid_write += any(p.suffix == ".tmp" for p in path.parent.iterdir())
    assert mid_write >= 2, f"only {mid_write}/{trials} kills landed mid-write"


def _crash_at(point: str, path: Path) -> str:
    """Child: save step 2 over step 1 and SIGKILL itself at ``point`` of the save sequence."""

    def die(*_args, **_kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    original_write, original_replace = ckpt._write_payload, os.replace
    if point == "mid_payload":
        def write(f, data):
            original_write(f, memoryview(data)[: len(data) // 2])
            f.flush()
            die()

        ckpt._write_payload = write
    elif point == "before_rotation":
        ckpt._rotate_previous = die
    elif point == "mid_rotation":
        ckpt.os.link = die
    elif point == "before_replace":
        def replace(src, dst):
            if Path(dst) == path:
                die()
            original_replace(src, dst)

        ckpt.os.replace = replace
    elif point == "before_dir_fsync":
        ckpt._fsync_dir = die
    save_checkpoint({"step": 2, "w": torch.full((4096,), 2.0)}, path)
    return "not killed"


@pytest.mark.parametrize(
    ("point", "latest_step"),
    [("mid_payload", 1), ("before_rotation", 1), ("mid_rotation", 1), ("before_replace", 1), ("before_dir_fsync", 2)],
)
def test_crash_at_each_step_of_save_leaves_valid_checkpoints(tmp_path, point, latest_step):
    path = tmp_path / "c.pt"
    save_checkpoint({"step": 0, "w": torch.full((4096,), 0.0)}, path)
    save_checkpoint({"step": 1, "w": torch.full((4096,), 1.0)}, path)
    pid = os.fork()
    if pid == 0:
        try:
            torch.set_num_threads(1)
            _crash_at(point, path)
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    latest = load_checkpoint(path)
    assert latest["step"] == latest_step and torch.equal(latest["w"], torch.full((4096,), float(latest_step)))
    assert load_checkpoint(previous_path(path))["step"] in (0, 1)


def test_checkpoints_get_the_mode_a_new_file_gets(tmp_path):
    """Atomic writes go through a temporary file; the file written ends with 0666 less the umask, as open()."""
    old = os.umask(0o022)
    try:
        path = save_checkpoint(_training_state(), tmp_path / "c.pt")
        save_checkpoint(_training_state(8), path)
        assert path.stat().st_mode & 0o777 == 0o644
        assert previous_path(path).stat().st_mode & 0o777 == 0o644
    finally:
        os.umask(old)


def test_writes_never_touch_the_process_umask(tmp_path, monkeypatch):
    """Setting the umask to read it would race with files other threads create meanwhile."""
    def forbidden(_mask):
        raise AssertionError("os.umask called during a checkpoint write")

    monkeypatch.setattr(os, "umask", forbidden)
    path = save_checkpoint(_training_state(), tmp_path / "c.pt")
    save_checkpoint(_training_state(8), path)
    assert load_checkpoint(path)["step"] == 8 and not list(tmp_path.glob(".*.tmp"))
