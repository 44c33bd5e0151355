"""COCO evaluation path: ground truth submitted as predictions scores 1.0, shifted boxes score low."""

from __future__ import annotations

import json

import pytest

from laplacianformer.detection import cli
from laplacianformer.detection.coco import load_coco, split_paths
from laplacianformer.detection.evaluate import METRIC_KEYS, coco_metrics


def _gt_as_results(coco, segm: bool):
    out = []
    for a in coco.data["annotations"]:
        r = {"image_id": a["image_id"], "category_id": a["category_id"], "bbox": a["bbox"], "score": 1.0}
        if segm:
            r["segmentation"] = a["segmentation"]
        out.append(r)
    return out


def test_ground_truth_scores_one_and_shifted_boxes_score_low(scenes):
    coco = load_coco(*split_paths(scenes, "val"))
    assert coco.data["annotations"], "the tiny val set should have objects"
    m = coco_metrics(coco, _gt_as_results(coco, segm=True), ("bbox", "segm"))
    for t in ("bbox", "segm"):
        assert set(m[t]) == set(METRIC_KEYS)
        assert m[t]["AP"] == pytest.approx(1.0) and m[t]["AP50"] == pytest.approx(1.0) and m[t]["AR100"] == pytest.approx(1.0)
    shifted = [dict(r, bbox=[r["bbox"][0] + 0.6 * r["bbox"][2], r["bbox"][1] + 0.6 * r["bbox"][3], *r["bbox"][2:]])
               for r in _gt_as_results(coco, segm=False)]
    low = coco_metrics(coco, shifted)
    assert low["bbox"]["AP"] < 0.05 and low["bbox"]["AP50"] < 0.05 and "segm" not in low
    empty = coco_metrics(coco, [])
    assert empty["bbox"]["AP"] == 0.0 and empty["detections"] == 0


def test_cli_eval_of_a_results_file_writes_the_metrics_json(scenes, tmp_path, capsys):
    coco = load_coco(*split_paths(scenes, "val"))
    preds = tmp_path / "results.json"
    preds.write_text(json.dumps(_gt_as_results(coco, segm=True)))
    out = tmp_path / "m.json"
    ann = scenes / "annotations" / "instances_val.json"
    assert cli.main(["eval", "--predictions", str(preds), "--annotations", str(ann), "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "AP50" in printed and "segm" in printed and "loading" not in printed.lower()  # pycocotools' prints captured
    m = json.loads(out.read_text())
    assert m["bbox"]["AP"] == pytest.approx(1.0) and m["segm"]["AP75"] == pytest.approx(1.0)
    assert {"AP", "AP50", "AP75", "APs", "APm", "APl", "AR100"} <= set(m["bbox"])
