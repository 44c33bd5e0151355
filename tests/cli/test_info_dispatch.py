"""``laplacianformer info --dispatch``: each op's backend decision for laplacian_attention at a given
input shape, dtype and device (ops/attention.py explain_all); bad values are one-line user errors."""

from __future__ import annotations

import pytest

from laplacianformer.cli import main


def _error(capsys, argv):
    rc = main(argv)
    err = capsys.readouterr().err.strip()
    assert rc == 2 and "Traceback" not in err, err
    return err.splitlines()[-1]


def test_info_dispatch_prints_every_op(capsys):
    assert main(["info", "--dispatch", "--shape", "1,2,64,16", "--landmarks", "4,4"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("laplacian_attention at q (1, 2, 64, 16)") and "hw=(8, 8), landmarks=(4, 4)" in out
    for op in ("pooling", "kernel", "newton_schulz", "normalization"):
        assert f"] {op}: selection 'auto' runs" in out, out
    assert "newton_schulz_grad" not in out


def test_info_dispatch_backward_1d_and_dtype(capsys):
    assert main(["info", "--dispatch", "--shape", "1,1,30,8", "--dtype", "float64", "--landmarks", "5",
                 "--backward"]) == 0
    out = capsys.readouterr().out
    assert "float64" in out and "hw=None, landmarks=5" in out and "newton_schulz_grad: selection 'auto'" in out


def test_info_dispatch_names_the_normalisation_limit(capsys, monkeypatch):
    from laplacianformer.ops import _runtime

    monkeypatch.setattr(_runtime, "triton_interpreted", lambda: True)  # CPU tensors pass the device check
    assert main(["info", "--dispatch", "--shape", "1,1,64,128", "--landmarks", "4,4"]) == 0
    out = capsys.readouterr().out
    assert "normalization: selection 'auto' runs 'cpu'" in out or "runs 'fused'" in out
    assert "triton: m=16, e=128: the Triton passes take m, e <= 64" in out, out


@pytest.mark.parametrize("argv,needle", [
    (["--shape", "1,2,64"], "--shape"),
    (["--shape", "1,2,64,16", "--hw", "7,7"], "hw"),
    (["--shape", "1,1,16,8", "--hw", "4,4", "--landmarks", "8"], "perfect square"),
])
def test_info_dispatch_bad_values(capsys, argv, needle):
    assert needle in _error(capsys, ["info", "--dispatch", *argv])


def test_info_needs_a_model_or_dispatch(capsys):
    assert "MODEL" in _error(capsys, ["info"])
