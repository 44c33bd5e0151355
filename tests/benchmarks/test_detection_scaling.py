"""Smoke test of ``laplacianformer.bench.detection_scaling`` at tiny sides (micro backbone, 16-channel FPN)."""

import json

import torch


def test_detection_scaling_smoke_and_skip_rule(tmp_path):
    from laplacianformer.bench import detection_scaling

    prev = torch.get_num_threads()
    out = tmp_path / "ds"
    try:
        detection_scaling.main(["--model", "laplacianformer_micro", "--sizes", "64", "96", "--variants", "laplacian",
                                "full-softmax", "--fpn-channels", "16", "--repeats", "1", "--memory", "heap",
                                "--threads", "1", "--no-progress", "--max-call-seconds", "1e-6", "--out", str(out)])
    finally:
        torch.set_num_threads(prev)
    res = json.loads(out.with_suffix(".json").read_text())["results"]
    assert [(r["variant"], r["size"], r["mode"]) for r in res["rows"]] == [
        ("laplacian", 64, "infer"), ("full-softmax", 64, "infer"), ("laplacian", 64, "train"), ("full-softmax", 64, "train")]
    assert all(r["median_ms"] > 0 and r["heap_mb"] is not None for r in res["rows"])
    # at 96 px every case is predicted above the (tiny) cap: skipped with the reason recorded
    assert {(s["variant"], s["size"]) for s in res["skipped"]} == {("laplacian", 96), ("full-softmax", 96)}
    assert all("cap" in s["reason"] for s in res["skipped"])
    assert {r["variant"] for r in res["ratios"]} == {"full-softmax"}
    md = out.with_suffix(".md").read_text()
    assert "time / laplacian" in md and "Skipped:" in md and out.with_suffix(".png").stat().st_size > 0
