"""experiments.detection_report: grouping by backbone, paired CIs against a hand-worked example, files."""

from __future__ import annotations

import json

import pytest

from laplacianformer.experiments import detection_report as dr


def _run(root, name, attn, seed, ap, ap50, *, finished=True, segm=None, attn_kwargs=None):
    d = root / name
    d.mkdir()
    kwargs = {} if attn == "laplacian" and not attn_kwargs else {"attn": attn}
    if attn_kwargs:
        kwargs["attn_kwargs"] = attn_kwargs
    (d / "train_config.json").write_text(json.dumps(
        {"detector": "retinanet", "backbone": "laplacianformer_tiny", "backbone_kwargs": kwargs, "seed": seed}))
    val = {"bbox": {"AP": ap / 2, "AP50": ap50 / 2}}
    (d / "history.json").write_text(json.dumps({"epochs": [
        {"step": 500, "train_time_s": 60.0, "cpu_time_s": 100.0, "val": val},
        {"step": 900, "train_time_s": 60.0, "cpu_time_s": 100.0, "val": {"bbox": {"AP": ap, "AP50": ap50}}}]}))
    if finished:
        metrics = {"bbox": {"AP": ap, "AP50": ap50, "AP75": ap / 2}, "images": 1000}
        if segm is not None:
            metrics["segm"] = {"AP": segm, "AP50": segm, "AP75": segm}
        (d / "eval_val.json").write_text(json.dumps(metrics))


def test_groups_paired_ci_and_files(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    # Laplacian AP 0.50 / 0.52 / 0.54; SR-softmax 0.48 / 0.51 / 0.50: differences 0.02, 0.01, 0.04
    for seed, (lap, sr) in enumerate([(0.50, 0.48), (0.52, 0.51), (0.54, 0.50)]):
        _run(runs, f"retinanet-laplacian-s{seed}", "laplacian", seed, lap, 0.8)
        _run(runs, f"retinanet-srsoftmax-s{seed}", "softmax", seed, sr, 0.8)
    _run(runs, "retinanet-gaussian-s0", "gaussian", 0, 0.4, 0.7, finished=False)
    result = dr.report(runs, tmp_path / "out")

    assert result["unfinished"] == ["retinanet-gaussian-s0"]
    groups = result["summary"]["groups"]
    lap = groups["retinanet / laplacianformer_tiny / laplacian"]
    assert lap["n"] == 3 and lap["seeds"] == [0, 1, 2]
    assert lap["bbox"]["AP"]["mean"] == pytest.approx(0.52)
    assert lap["bbox"]["AP"]["std"] == pytest.approx(0.02)
    assert lap["train_time_s"]["mean"] == pytest.approx(120.0)
    (ap,) = [c for c in result["summary"]["paired"] if c["metric"] == "bbox AP"]
    # hand-worked: d = 0.02, 0.01, 0.04; mean 0.07/3; sd = sqrt(((-1/3)^2 + (-4/3)^2 + (5/3)^2) / 2) * 0.01
    # = 0.0152753; t(0.975, 2) = 4.302653; half = 4.302653 * 0.0152753 / sqrt(3) = 0.0379460
    assert ap["n"] == 3 and ap["mean_delta"] == pytest.approx(0.0233333, abs=1e-6)
    assert ap["ci95"] == pytest.approx([0.0233333 - 0.0379460, 0.0233333 + 0.0379460], abs=1e-6)
    md = (tmp_path / "out" / "fashionscenes.md").read_text()
    assert "52.0 ± 2.0" in md and "[-1.5, +6.1]" in md and "Unfinished" in md
    assert (tmp_path / "out" / "ap_curves.png").stat().st_size > 0
    assert json.loads((tmp_path / "out" / "fashionscenes.json").read_text())["finished"][0]["curve"][1]["step"] == 900


def test_single_seed_and_segm(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    _run(runs, "maskrcnn-laplacian-s0", "laplacian", 0, 0.3, 0.6, segm=0.25)
    result = dr.report(runs, tmp_path / "out")
    (g,) = result["summary"]["groups"].values()
    assert g["segm"]["AP"]["mean"] == pytest.approx(0.25) and g["bbox"]["AP"]["std"] is None
    assert result["summary"]["paired"] == []


def test_settings_variants_are_groups_paired_with_default_and_softmax(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    for seed, (lap, var, sr) in enumerate([(0.15, 0.20, 0.27), (0.16, 0.22, 0.28), (0.14, 0.21, 0.28)]):
        _run(runs, f"lap-s{seed}", "laplacian", seed, lap, 0.3)
        _run(runs, f"var-s{seed}", "laplacian", seed, var, 0.3, attn_kwargs={"norm_scale": "inv_n", "lam": 0.5})
        _run(runs, f"sr-s{seed}", "softmax", seed, sr, 0.4)
    result = dr.report(runs, tmp_path / "out")
    var_key = "retinanet / laplacianformer_tiny / laplacian lam=0.5 norm_scale=inv_n"
    assert set(result["summary"]["groups"]) == {"retinanet / laplacianformer_tiny / laplacian", var_key,
                                                "retinanet / laplacianformer_tiny / softmax"}
    pairs = {(c["a"], c["b"]): c for c in result["summary"]["paired"] if c["metric"] == "bbox AP"}
    assert pairs[("retinanet / laplacianformer_tiny / laplacian", var_key)]["mean_delta"] == pytest.approx(-0.06)
    # the gap left: variant − softmax
    gap = pairs[(var_key, "retinanet / laplacianformer_tiny / softmax")]
    assert gap["n"] == 3 and gap["mean_delta"] == pytest.approx(-0.0666667, abs=1e-6)
    assert len(pairs) == 3


def test_kernel_families_pair_with_the_scaled_default_and_softmax(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    rows = [(0.15, 0.28, 0.30, 0.27), (0.16, 0.30, 0.29, 0.28), (0.14, 0.29, 0.33, 0.28)]
    for seed, (lap, default, fam, sr) in enumerate(rows):
        _run(runs, f"lap-s{seed}", "laplacian", seed, lap, 0.3)
        _run(runs, f"def-s{seed}", "laplacian", seed, default, 0.4, attn_kwargs={"norm_scale": "inv_n"})
        _run(runs, f"cauchy-s{seed}", "cauchy", seed, fam, 0.4, attn_kwargs={"norm_scale": "inv_n", "lam": 0.028})
        _run(runs, f"sr-s{seed}", "softmax", seed, sr, 0.4)
    result = dr.report(runs, tmp_path / "out")
    key = "retinanet / laplacianformer_tiny / {}".format
    fam = key("cauchy lam=0.028 norm_scale=inv_n")
    pairs = {(c["a"], c["b"]): c for c in result["summary"]["paired"] if c["metric"] == "bbox AP"}
    assert pairs[(fam, key("laplacian norm_scale=inv_n"))]["mean_delta"] == pytest.approx(0.05 / 3, abs=1e-9)
    assert pairs[(fam, key("softmax"))]["mean_delta"] == pytest.approx(0.09 / 3, abs=1e-9)
    # the family is not paired with the unscaled paper default (two changes at once)
    assert (key("laplacian"), fam) not in pairs
    assert "every other kernel family" in (tmp_path / "out" / "fashionscenes.md").read_text()
    # the results page's kernel-family rows: the two references, then the family with its paired Δ AP
    table = dr.kernel_family_table(result).splitlines()
    assert [line.split(" | ")[2] for line in table[2:]] == [
        "laplacian norm_scale=inv_n", "softmax", "cauchy lam=0.028 norm_scale=inv_n"]
    family = table[-1].split(" | ")
    assert family[3:7] == ["0, 1, 2", "30.7 ± 2.1", "40.0 ± 0.0", "+1.7"] and family[8] == "+3.0"
    assert dr.kernel_family_table({"summary": {"groups": {}, "paired": []}}) == ""


def test_bad_input_names_the_file(tmp_path, capsys):
    assert dr.main(["--runs", str(tmp_path / "missing")]) == 2
    assert "is not a directory" in capsys.readouterr().err
    runs = tmp_path / "runs"
    runs.mkdir()
    _run(runs, "r", "laplacian", 0, 0.3, 0.6)
    (runs / "r" / "eval_val.json").write_text("{trunc")
    assert dr.main(["--runs", str(runs), "--out", str(tmp_path / "o")]) == 2
    assert "eval_val.json: not a readable JSON file" in capsys.readouterr().err


def test_results_page_kernel_block_carries_the_detection_rows(tmp_path):
    """``results_page.kernels_section`` adds the families' detection rows from the report's JSON, and says
    "Not recorded yet." without one."""
    from laplacianformer.experiments import results_page

    runs = tmp_path / "runs"
    runs.mkdir()
    for seed, (default, fam) in enumerate([(0.28, 0.30), (0.30, 0.29)]):
        _run(runs, f"def-s{seed}", "laplacian", seed, default, 0.4, attn_kwargs={"norm_scale": "inv_n"})
        _run(runs, f"gauss-s{seed}", "gaussian", seed, fam, 0.4, attn_kwargs={"norm_scale": "inv_n", "lam": 3.9})
    dr.report(runs, tmp_path / "out")
    block = results_page.kernels_section(tmp_path / "kernels", tmp_path, tmp_path / "out" / "fashionscenes.json")
    detection = block.split("### Detection", 1)[1].split("###", 1)[0]
    assert "| retinanet | laplacianformer_tiny | gaussian lam=3.9 norm_scale=inv_n | 0, 1 | 29.5 ± 0.7 |" in detection
    assert "out/fashionscenes.md" in detection
    missing = results_page.kernels_section(tmp_path / "kernels", tmp_path, tmp_path / "none.json")
    assert "Not recorded yet." in missing.split("### Detection", 1)[1].split("###", 1)[0]
