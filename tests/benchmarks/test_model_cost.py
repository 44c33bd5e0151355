"""The cost panel's measurements (laplacianformer.bench.model_cost, on the harness), on tiny sizes."""

from __future__ import annotations

import json

import pytest
import torch

from laplacianformer.bench import harness
from laplacianformer.bench import model_cost as cost


def test_peak_heap_sees_a_live_allocation():
    if harness.heap_in_use() is None:
        pytest.skip("mallinfo2 is not available (not glibc)")
    peak = harness.peak_heap_mib(lambda: (torch.ones(16 * 2**20) + 1).sum())  # two 64 MiB tensors live at once
    assert 120 < peak < 200


def test_saved_activations_exclude_parameters():
    lin = torch.nn.Linear(256, 256)
    x = torch.randn(1024, 256)
    mib = harness.saved_activation_mib(lambda: torch.relu(lin(x)), exclude=list(lin.parameters()))
    # x (saved by the matmul) and the relu output: 1 MiB each; the weight is excluded
    assert mib == pytest.approx(2.0)


def test_round_robin_reports_wall_and_cpu_medians():
    calls = []
    res = harness.round_robin({"a": lambda: calls.append("a"), "b": lambda: calls.append("b")}, repeats=3)
    assert calls == ["a", "b"] + ["a", "b"] * 3  # one warm-up each, then rounds alternate
    assert set(res["a"].as_dict()) >= {"median_ms", "iqr_ms", "cpu_ms", "repeats", "warmup_ms"}
    assert res["a"].repeats == 3 and len(res["a"].warmup_ms) == 1


def test_measure_cost_tiny_and_the_cap():
    cells = cost.measure_cost(attns=["laplacian", "softmax"], sizes=[32], repeats=1, max_seconds=1.0)
    assert {(c["mode"], c["attn"]) for c in cells} == {(m, a) for m in cost.MODES for a in ("laplacian", "softmax")}
    for c in cells:
        assert c["ms_per_image"] > 0 and c["cpu_ms_per_image"] > 0 and c["tokens_stage1"] == 64
        assert (c["activations_mib"] or 0) > 0 if c["mode"] == "train" else c["activations_mib"] is None
    skipped = cost.measure_cost(attns=["softmax"], sizes=[32, 48], modes=["infer"], repeats=1, cap_s=0.0)
    assert [c["size"] for c in skipped] == [32, 48]
    assert "cap" in skipped[0]["skipped"] and skipped[1]["skipped"].startswith("a smaller size was over the cap")
    assert "skipped" in cost.cost_table(skipped)


def test_cost_main_writes_json_table_and_plot(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # default: a run directory under the current one
    cost.main(["--sizes", "32", "--attns", "softmax", "--repeats", "1"])
    stem = tmp_path / "runs" / "bench" / "model_cost" / "model_cost_cpu"
    data = json.loads(stem.with_suffix(".json").read_text())
    assert data["settings"]["threads"] == 1 and len(data["cells"]) == 2
    assert stem.with_suffix(".png").stat().st_size > 0 and "| 32² |" in stem.with_suffix(".md").read_text()
