"""CLI (issue 4.1, 4.5): user errors end with exit status 2 and one line naming the flag or path, no
traceback (``--debug`` re-raises), and nothing already written is changed; eval/info work (bench:
tests/benchmarks/test_output.py)."""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest

from laplacianformer.cli import main

TINY_MODEL = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}
TINY = ["--data", "digits", "--img-size", "16", "--train-subset", "64", "--test-subset", "32", "--batch-size",
        "32", "--model-kwargs", json.dumps(TINY_MODEL), "--threads", "1", "--no-progress", "--no-hflip"]


def _one_line_error(capsys, argv, *needles):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2, err
    assert "Traceback" not in err
    last = err.splitlines()[-1]
    assert last.startswith("laplacianformer: error: "), err
    for n in needles:
        assert n in last, (n, last)
    return last


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", *TINY, "--epochs", "1", "--max-steps", "2", "--out", str(out)]) == 0
    return out


@pytest.mark.parametrize("flags,needle", [
    (["--lr", "-1"], "--lr"),
    (["--epochs", "0"], "--epochs"),
    (["--batch-size", "abc"], "--batch-size"),
    (["--amp", "fp8"], "--amp"),
    (["--attn-kwargs", "{lam: 2"], "--attn-kwargs"),
    (["--label-smoothing", "2"], "--label-smoothing"),
    (["--attn", "linear"], "--attn"),
    (["--bogus-flag"], "--bogus-flag"),
])
def test_bad_flag_values(capsys, tmp_path, flags, needle):
    _one_line_error(capsys, ["train", *TINY, "--out", str(tmp_path / "r"), *flags], needle)
    assert not (tmp_path / "r").exists()


def test_missing_empty_and_corrupt_data(capsys, tmp_path):
    _one_line_error(capsys, ["train", "--data", str(tmp_path / "nope"), "--out", str(tmp_path / "r")],
                    str(tmp_path / "nope"), "does not exist")
    (tmp_path / "empty").mkdir()
    _one_line_error(capsys, ["train", "--data", str(tmp_path / "empty")], str(tmp_path / "empty"))
    from PIL import Image

    root = tmp_path / "imgs"
    for c in ("a", "b"):
        (root / c).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(np.full((8, 8), 50 * i, np.uint8)).save(root / c / f"{i}.png")
    (root / "b" / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\ngarbage")
    _one_line_error(capsys, ["train", "--data", str(root)], "bad.png")


def test_debug_shows_the_traceback(tmp_path):
    from laplacianformer.data import DataError

    with pytest.raises(DataError):
        main(["--debug", "train", "--data", str(tmp_path / "nope")])
    with pytest.raises(DataError):
        main(["train", "--data", str(tmp_path / "nope"), "--debug"])


def test_eval_writes_metrics_and_confusion_png(capsys, run_dir, tmp_path):
    assert main(["eval", "--checkpoint", str(run_dir), "--out", str(tmp_path), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "top-1" in out and "top-5" in out
    res = json.loads((tmp_path / "eval.json").read_text())
    assert res["n"] == 359 and len(res["per_class"]) == 10 and 0 <= res["top1"] <= 1
    assert (tmp_path / "confusion.png").stat().st_size > 0


def test_checkpoint_from_another_model(capsys, run_dir):
    _one_line_error(capsys, ["eval", "--checkpoint", str(run_dir / "checkpoint.safetensors"), "--model",
                             "laplacianformer_tiny"], "weights do not fit")
    _one_line_error(capsys, ["train", "--resume", str(run_dir), "--model", "laplacianformer_tiny"],
                    "model=", str(run_dir))


def test_truncated_checkpoint_fails_cleanly_and_keeps_files(capsys, run_dir, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(run_dir, bad)
    (bad / "model.safetensors").unlink()
    (bad / "checkpoint.safetensors.prev").unlink(missing_ok=True)  # no previous checkpoint to fall back to
    data = (bad / "checkpoint.safetensors").read_bytes()
    (bad / "checkpoint.safetensors").write_bytes(data[: len(data) // 2])
    before = {p.name: p.read_bytes() for p in bad.iterdir()}
    _one_line_error(capsys, ["eval", "--checkpoint", str(bad)], "checkpoint.safetensors", "truncated")
    _one_line_error(capsys, ["train", "--resume", str(bad)], "checkpoint.safetensors", "truncated")
    _one_line_error(capsys, ["train", "--resume", str(run_dir), "--lr", "-1"], "--lr")
    assert {p.name: p.read_bytes() for p in bad.iterdir()} == before


def test_info_and_unknown_model(capsys):
    assert main(["info", "laplacianformer_micro", "--img-size", "32"]) == 0
    assert "params" in capsys.readouterr().out
    _one_line_error(capsys, ["info", "no_such_model"], "no_such_model")


def test_missing_experiment_module_is_one_line(capsys):
    from laplacianformer import cli

    with pytest.raises(cli.UserError, match="not installed"):
        cli.cmd_forward("no_such_experiment", [])
