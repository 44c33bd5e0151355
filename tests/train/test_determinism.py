"""Same machine, same thread count, same settings: two runs end bit-identical (docs/MEASUREMENTS.md, "The demo").

Across machines this is not promised (BLAS kernels and instruction sets change the summation order); the
spread between thread counts measured on the project machine is in docs/MEASUREMENTS.md.
"""

from __future__ import annotations

import pytest
import torch
from train_helpers import tiny_config

from safetensors.torch import load_file


@pytest.mark.parametrize("attn", ["laplacian", "softmax"])
def test_two_identical_runs_give_bit_identical_weights_and_metrics(tmp_path, attn):
    pytest.importorskip("sklearn")
    from laplacianformer.train import train

    runs = [train(tiny_config(tmp_path / f"run{i}", attn=attn, train_subset=128, test_subset=64, seed=3,
                              lr=3e-3, drop_path=0.0)) for i in range(2)]
    for key in ("top1", "top5", "loss", "steps", "history", "confusion"):
        a, b = runs[0][key], runs[1][key]
        if key == "history":  # per-epoch rows carry the wall-clock training time, which differs
            a = [{k: v for k, v in row.items() if "time" not in k} for row in a]
            b = [{k: v for k, v in row.items() if "time" not in k} for row in b]
        assert a == b, key
    w0 = load_file(tmp_path / "run0" / "model.safetensors")
    w1 = load_file(tmp_path / "run1" / "model.safetensors")
    assert w0.keys() == w1.keys()
    for k in w0:
        assert torch.equal(w0[k], w1[k]), k
