"""Issue 29's target table (``benchmarks/gpu_targets.py``) read from the first H200 run's committed files, from
missing files and from small synthetic ones; the producers of its rows that are new (``benchmarks/gpu_micro.py``,
the bf16-autocast rows of ``model_throughput`` and ``gpu_overhead``) at smoke sizes on the CPU."""

import json
import math
from pathlib import Path

import pytest
import torch

from benchmarks import gpu_micro, gpu_targets
from laplacianformer.bench import gpu_overhead, model_throughput

H200 = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "gpu_check_h200"


def _results(name: str):
    payload = json.loads((H200 / name).read_text())
    return payload.get("results", payload)  # roofline_measured.json is the bare payload


def _row(rows, quantity_start: str, precision: str = "fp32") -> dict:
    hits = [r for r in rows if r["quantity"].startswith(quantity_start) and r["precision"] == precision]
    assert len(hits) == 1, (quantity_start, precision, [r["quantity"] for r in rows])
    return hits[0]


@pytest.fixture(scope="module")
def committed(tmp_path_factory):
    """The table of the committed H200 directory as both measured and previous (main: Markdown, JSON, PNG)."""
    out = tmp_path_factory.mktemp("targets") / "gpu_targets"
    assert gpu_targets.main(["--measured", str(H200), "--previous", str(H200), "--out", str(out)]) == 0
    return out, json.loads(out.with_suffix(".json").read_text())["results"]


def test_committed_run_values_come_from_its_files(committed):
    out, rows = committed
    assert out.with_suffix(".md").read_text().count("\n| ") == len(gpu_targets.TARGETS) + 1  # header + rows
    assert out.with_suffix(".png").stat().st_size > 0
    assert len(rows) == len(gpu_targets.TARGETS)
    for r in rows:  # the same files on both sides
        assert (r["previous"], r["previous_value"], r["previous_met"]) == (r["measured"], r["measured_value"], r["met"])

    overhead = {r["attn"]: r for r in _results("gpu_overhead_cuda.json")}
    eager = _row(rows, "Tiny 512² inference, eager")
    assert eager["measured_value"] == pytest.approx(overhead["laplacian"]["eager_ms"] / overhead["softmax"]["eager_ms"])
    assert eager["measured_value"] == pytest.approx(30.69 / 8.12, rel=1e-3) and eager["met"] == "no"
    assert eager["measured_source"] == "gpu_overhead_cuda.json" and eager["measured"].startswith("3.78×")
    graph = _row(rows, "Tiny 512² inference, CUDA graph")
    assert graph["measured_value"] == pytest.approx(overhead["laplacian"]["graph_ms"] / overhead["softmax"]["graph_ms"])
    compiled = {r["attn"]: r for r in _results("gpu_overhead_cuda_compiled.json")}
    compile_row = _row(rows, "Tiny 512² inference, torch.compile")
    assert compile_row["measured_value"] == pytest.approx(
        compiled["laplacian"]["compiled_ms"] / compiled["softmax"]["compiled_ms"])
    assert compile_row["met"] == "no target"

    ratios = {(r["size"], r["mode"], r["attn"]): r["time_vs_softmax"]
              for r in _results("model_throughput_cuda.json")["ratios"]}
    assert _row(rows, "Tiny 224² inference")["measured_value"] == pytest.approx(ratios[(224, "infer", "laplacian")])
    assert _row(rows, "Tiny 512² training")["measured_value"] == pytest.approx(ratios[(512, "train", "laplacian")])
    for mode in ("inference", "training"):  # faster first at 1536² (model_throughput_cuda_highres.json)
        row = _row(rows, f"crossover, {mode}")
        assert row["measured_value"] == 1536 and "slower at 1024²" in row["measured"] and row["met"] == "no"

    stage = [r["median_ms"] for r in _results("stage_attention_cuda.json")["rows"]
             if r["attn"] == "laplacian" and r["mode"] == "infer"]
    assert _row(rows, "one attention layer")["measured_value"] == pytest.approx(max(stage))
    ns64 = [r["measured_us"] for r in _results("roofline_measured.json")["rows"]
            if r["kernel"] == "ns_fwd" and r["batch_heads"] == 64]
    assert _row(rows, "Newton–Schulz, 64")["measured_value"] == pytest.approx(max(ns64))
    assert "roofline" in _row(rows, "Newton–Schulz, 64")["measured"]
    kernel = next(r for r in _results("kernels_cuda.json")
                  if (r["case"], r["backend"], r["mode"], r["n"]) == ("kernel", "triton", "fwd", 65536))
    assert _row(rows, "one C matrix")["measured_value"] == pytest.approx(kernel["median_ms"] * 1e3)
    scaling = {r["method"]: r["time"]["median_ms"] for r in _results("attention_scaling_cuda.json")["records"]
               if r["n"] == 65536 and r["status"] == "ok"}
    assert _row(rows, "operator fwd+bwd")["measured_value"] == pytest.approx(scaling["laplacian"] / scaling["soft"])
    # what the first run did not measure
    for quantity in ("Newton–Schulz, 132", "Newton–Schulz vs float64"):
        assert _row(rows, quantity)["met"] == "not measured"
    assert all(r["met"] == "not measured" and r["measured"] == "not measured" for r in rows if r["precision"] != "fp32")


def test_missing_files_and_rows_are_not_measured(tmp_path):
    rows = gpu_targets.table_rows(tmp_path, H200)
    assert {r["met"] for r in rows} == {"not measured"} and {r["measured"] for r in rows} == {"not measured"}
    assert _row(rows, "Tiny 512² inference, eager")["previous"].startswith("3.78×")
    # a file without the softmax row, one that is not JSON, and another model's run
    settings = dict(model="laplacianformer_tiny", batch=8, size=512)
    (tmp_path / "gpu_overhead_cuda.json").write_text(json.dumps(
        dict(settings=settings, results=[dict(attn="laplacian", eager_ms=10.0, graph_ms=5.0)])))
    (tmp_path / "stage_attention_cuda.json").write_text("{not json")
    (tmp_path / "model_throughput_cuda.json").write_text(json.dumps(dict(settings={}, results=dict(rows=[
        dict(model="laplacianformer_micro", batch=8, size=224, mode="infer", attn=a, median_ms=1.0)
        for a in ("laplacian", "softmax")]))))
    rows = gpu_targets.table_rows(tmp_path, None)
    assert {r["met"] for r in rows} == {"not measured"} and {r["previous"] for r in rows} == {"not measured"}


def _write(directory: Path, name: str, results, settings=None) -> None:
    (directory / name).write_text(json.dumps(dict(settings=settings or {}, results=results)))


def test_targets_judged_on_synthetic_files(tmp_path):
    tiny = dict(model="laplacianformer_tiny", batch=8, size=512)
    _write(tmp_path, "gpu_overhead_cuda.json", [dict(attn="laplacian", eager_ms=10.0, graph_ms=12.0),
                                                 dict(attn="softmax", eager_ms=9.0, graph_ms=10.0)], tiny)
    _write(tmp_path, "gpu_overhead_cuda_bf16.json", [dict(attn="laplacian", precision="bf16-autocast", eager_ms=13.0),
                                                      dict(attn="softmax", precision="bf16-autocast", eager_ms=10.0)],
           dict(tiny, size=1024))  # another size: not the 512² row
    times = {(224, "infer"): (3.0, 2.0), (512, "infer"): (4.0, 3.9), (768, "infer"): (5.0, 6.0),
             (224, "train"): (9.0, 3.0), (512, "train"): (10.0, 8.0), (768, "train"): (20.0, 15.0)}
    _write(tmp_path, "model_throughput_cuda.json", dict(rows=[
        dict(model="laplacianformer_tiny", batch=8, size=s, mode=m, attn=a, median_ms=t, precision="fp32")
        for (s, m), pair in times.items() for a, t in zip(("laplacian", "softmax"), pair)]))
    _write(tmp_path, "gpu_micro_cuda.json", [
        dict(case="ns", matrices=64, m=49, iters=20, max_cond=1e3, median_us=40.0, max_rel_err_vs_float64=2e-6),
        dict(case="ns", matrices=132, m=49, iters=20, max_cond=1e3, median_us=55.0, max_rel_err_vs_float64=3e-5),
        dict(case="kernel", group_tokens=131072, d=64, m=49, median_us=59.0)])
    _write(tmp_path, "attention_scaling_cuda.json", dict(records=[
        dict(method="laplacian", n=65536, status="ok", time=dict(median_ms=5.0)),
        dict(method="soft", n=65536, status="ok", time=dict(median_ms=6.0))]))
    rows = gpu_targets.table_rows(tmp_path, None)
    judged = {(r["quantity"].split(" (")[0], r["precision"]): (r["measured_value"], r["met"]) for r in rows}
    assert judged[("Tiny 512² inference, eager", "fp32")] == (pytest.approx(10 / 9), "yes")  # <= 1.25
    assert judged[("Tiny 512² inference, CUDA graph", "fp32")] == (pytest.approx(1.2), "no")  # > 1.1
    assert judged[("Tiny 512² inference, eager", "bf16-autocast")][1] == "not measured"
    assert judged[("Tiny 224² inference, eager", "fp32")] == (pytest.approx(1.5), "yes")  # the bound itself
    assert judged[("Tiny 512² training step", "fp32")] == (pytest.approx(1.25), "yes")
    assert judged[("crossover, inference", "fp32")] == (768, "yes")
    assert judged[("crossover, training step", "fp32")] == (None, "no")  # slower up to 768²: judged, no value
    assert "none up to 768²" in _row(rows, "crossover, training")["measured"]
    assert judged[("Newton–Schulz, 64 matrices 49×49, 20 iterations", "fp32")] == (40.0, "yes")
    assert judged[("Newton–Schulz, 132 matrices 49×49", "fp32")] == (55.0, "no")
    assert judged[("Newton–Schulz vs float64, cond ≤ 1e3", "fp32")] == (3e-5, "no")  # the worse batch counts
    assert judged[("one C matrix", "fp32")] == (59.0, "yes")
    assert judged[("operator fwd+bwd, N = 64k, B1 H2 d32", "fp32")] == (pytest.approx(5 / 6), "yes")
    assert judged[("one attention layer, eager inference", "fp32")] == (None, "not measured")
    # slower at every measured side, all smaller than 768²: not judged
    _write(tmp_path, "model_throughput_cuda.json", dict(rows=[
        dict(model="laplacianformer_tiny", batch=8, size=512, mode="infer", attn=a, median_ms=t)
        for a, t in (("laplacian", 2.0), ("softmax", 1.0))]))
    assert _row(gpu_targets.table_rows(tmp_path, None), "crossover, inference")["met"] == "not measured"
    assert gpu_targets.judge(gpu_targets.TARGETS[0], gpu_targets.Extracted(math.inf, "", "")) == "no"


def test_missing_directory_is_a_one_line_error(tmp_path, capsys):
    with pytest.raises(SystemExit):
        gpu_targets.main(["--measured", str(tmp_path / "nope"), "--previous", str(H200)])
    assert "--measured:" in capsys.readouterr().err


def test_gpu_micro_smoke_feeds_the_table(tmp_path):
    """On the CPU (the C loop): 64 and 132 matrices 49×49 at the issue's settings, a small kernel matrix."""
    out = tmp_path / "gpu_micro_cuda"  # the name the table reads
    gpu_micro.main(["--device", "cpu", "--ns-matrices", "64", "132", "--kernel-groups", "2", "--kernel-tokens", "64",
                    "--kernel-dim", "8", "--repeats", "1", "--out", str(out)])
    micro = json.loads(out.with_suffix(".json").read_text())["results"]
    ns = {r["matrices"]: r for r in micro if r["case"] == "ns"}
    assert set(ns) == {64, 132} and all(r["backend"] == "cpu" and r["median_us"] > 0 for r in ns.values())
    assert all(0 < r["max_rel_err_vs_float64"] < 1e-3 for r in ns.values())
    kernel = next(r for r in micro if r["case"] == "kernel")
    assert kernel["group_tokens"] == 128 and kernel["rel_err_vs_float64"] < 1e-5
    rows = gpu_targets.table_rows(tmp_path, None)
    assert _row(rows, "Newton–Schulz, 64")["measured_value"] == ns[64]["median_us"]
    assert _row(rows, "Newton–Schulz, 132")["measured_value"] == ns[132]["median_us"]
    assert _row(rows, "Newton–Schulz vs float64")["measured_value"] == max(
        r["max_rel_err_vs_float64"] for r in ns.values())
    assert _row(rows, "one C matrix")["met"] == "not measured"  # not the shape
    spd = gpu_micro.spd_matrices(3, 6, 1e3)
    eig = torch.linalg.eigvalsh(spd)
    want = torch.tensor([1.0, 10**1.5, 1e3], dtype=torch.float64)  # condition numbers log-spaced up to 1e3
    assert torch.allclose(eig[:, -1] / eig[:, 0], want, rtol=1e-8)


def test_bf16_autocast_rows_of_model_throughput_and_gpu_overhead(tmp_path):
    infer = model_throughput.make_case("laplacianformer_micro", "laplacian", 32, 1, "infer", autocast="bf16")
    assert infer().dtype == torch.bfloat16  # the head ran under autocast
    assert model_throughput.make_case("laplacianformer_micro", "softmax", 32, 1, "infer")().dtype == torch.float32
    loss = model_throughput.make_case("laplacianformer_micro", "laplacian", 32, 1, "train", autocast="bf16")()
    assert torch.isfinite(loss)
    out = tmp_path / "overhead"
    gpu_overhead.main(["--device", "cpu", "--model", "laplacianformer_micro", "--size", "32", "--batch", "1",
                       "--attn", "laplacian", "--repeats", "1", "--no-compile", "--autocast", "bf16",
                       "--out", str(out)])
    (row,) = json.loads(out.with_suffix(".json").read_text())["results"]
    assert row["precision"] == "bf16-autocast" and row["eager_ms"] > 0
    assert "bf16-autocast" in out.with_suffix(".md").read_text().splitlines()[0]
