"""``laplacianformer export``: exports a small model with dynamic sizes, checks onnxruntime against eager mode
at the export size and --sizes (a table of errors and times), fails with the table and a clear message above the tolerance, and
names the extra when onnx/onnxruntime are missing."""

import pytest

from laplacianformer.cli import main

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

SMALL = '{"depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 128], "num_heads": [1, 2, 2, 4]}'
ARGS = ["export", "--model", "laplacianformer_micro", "--model-kwargs", SMALL, "--num-classes", "4",
        "--img-size", "64", "--sizes", "40x72", "--runs", "1"]


def test_export_command_writes_checks_and_times(tmp_path, capsys):
    out = tmp_path / "m.onnx"
    assert main([*ARGS, "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert out.is_file() and f"wrote {out} (dynamic batch/H/W, TorchScript exporter" in text
    rows = [line.split() for line in text.splitlines() if "x" in line.split()[0] and line.split()[0][0].isdigit()]
    assert [r[0] for r in rows] == ["64x64", "40x72"]
    for r in rows:
        assert float(r[2]) <= 1e-4 and float(r[3]) > 0  # relative error, onnxruntime ms
    assert "onnxruntime within 0.0001 relative of eager mode at every size" in text


def test_export_command_fails_in_one_line_above_the_tolerance(tmp_path, capsys):
    assert main([*ARGS, "--static", "--tolerance", "1e-12", "--out", str(tmp_path / "s.onnx")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("laplacianformer: error: onnxruntime differs from eager mode above the tolerance 1e-12")
    assert "at 64x64" in err


def test_export_command_names_the_extra_when_onnxruntime_is_missing(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "onnxruntime" else real(name, *a))
    assert main([*ARGS, "--out", str(tmp_path / "m.onnx")]) == 2
    err = capsys.readouterr().err
    assert "onnxruntime: not installed" in err and "pip install laplacianformer[onnx]" in err
    assert not (tmp_path / "m.onnx").exists()
