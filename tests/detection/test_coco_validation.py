"""Bad COCO input stops with one clear message naming the file and the entry (docs/DETECTION.md)."""

from __future__ import annotations

import copy
import json

import pytest

from laplacianformer.detection import cli
from laplacianformer.detection.coco import AnnotationError, CocoDetection, load_coco

GOOD = {
    "images": [{"id": 1, "file_name": "a.png", "width": 64, "height": 48},
               {"id": 2, "file_name": "b.png", "width": 64, "height": 48}],  # image 2: no annotations (valid)
    "annotations": [{"id": 10, "image_id": 1, "category_id": 3, "bbox": [4, 4, 20, 10], "iscrowd": 0,
                     "segmentation": [[4, 4, 24, 4, 24, 14, 4, 14]]}],
    "categories": [{"id": 1, "name": "thing"}, {"id": 3, "name": "other"}],
}
FILES = {"a.png": (64, 48), "b.png": (64, 48)}


@pytest.fixture
def _bad(tmp_path, write_coco):
    def make(edit, files=FILES):
        data = copy.deepcopy(GOOD)
        edit(data)
        return write_coco(tmp_path, data, files)
    return make


def _error(ann, root) -> str:
    with pytest.raises(AnnotationError) as e:
        load_coco(ann, root / "val")
    return str(e.value)


def test_valid_file_with_an_image_without_annotations(tmp_path, _bad, write_coco):
    ann, root = write_coco(tmp_path, copy.deepcopy(GOOD), FILES)
    coco = load_coco(ann, root / "val")
    assert coco.category_ids == [1, 3] and coco.class_names == ["thing", "other"]
    ds = CocoDetection(coco, masks=True)
    image, target = ds[0]
    assert image.shape == (3, 48, 64) and target["labels"].tolist() == [2]  # category 3 -> label 2
    assert target["boxes"].tolist() == [[4.0, 4.0, 24.0, 14.0]] and target["masks"].shape == (1, 48, 64)
    assert coco.data["annotations"][0]["area"] == 200.0  # filled from the polygon
    image, target = ds[1]
    assert target["boxes"].shape == (0, 4) and target["masks"].shape == (0, 48, 64)


@pytest.mark.parametrize("key", ["images", "annotations", "categories"])
def test_missing_top_level_list(tmp_path, _bad, write_coco, key):
    msg = _error(*_bad(lambda d: d.pop(key)))
    assert "instances_val.json" in msg and f"missing the '{key}' list" in msg


def test_box_outside_its_image(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: d["annotations"][0].update(bbox=[50, 4, 20, 10])))
    assert "instances_val.json: annotation id 10: bbox [50, 4, 20, 10] lies outside image 1 (64 x 48)" in msg


def test_box_with_zero_area(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: d["annotations"][0].update(bbox=[4, 4, 0, 10])))
    assert "annotation id 10: bbox [4, 4, 0, 10] has zero area" in msg


def test_unknown_category_id(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: d["annotations"][0].update(category_id=2)))
    assert "annotation id 10: unknown category_id 2 (categories: [1, 3])" in msg


def test_annotation_of_a_missing_image(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: d["annotations"][0].update(image_id=7)))
    assert "annotation id 10: image_id 7 is not in 'images'" in msg


def test_image_file_missing_on_disk(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: None, files={"a.png": (64, 48)}))
    assert "image id 2: image file" in msg and "b.png does not exist" in msg


def test_truncated_json(tmp_path, _bad, write_coco):
    ann, root = write_coco(tmp_path, copy.deepcopy(GOOD), FILES)
    text = ann.read_text()
    ann.write_text(text[: len(text) // 2])
    msg = _error(ann, root)
    assert str(ann) in msg and "invalid JSON" in msg and "(truncated?)" in msg


def test_malformed_segmentation_and_duplicate_ids(tmp_path, _bad, write_coco):
    msg = _error(*_bad(lambda d: d["annotations"][0].update(segmentation=[[1, 2, 3]])))
    assert "annotation id 10: segmentation: a polygon" in msg
    msg = _error(*_bad(lambda d: d["annotations"].append(dict(d["annotations"][0]))))
    assert "annotation id 10: duplicate id" in msg


def test_image_size_differs_from_the_annotations(tmp_path, _bad, write_coco):
    ann, root = _bad(lambda d: None, files={"a.png": (32, 48), "b.png": (64, 48)})
    with pytest.raises(AnnotationError, match=r"image id 1: .*a\.png is 32 x 48, the annotations say 64 x 48"):
        CocoDetection(load_coco(ann, root / "val"))[0]


@pytest.mark.parametrize("edit", [
    lambda d: d.pop("categories"),
    lambda d: d["annotations"][0].update(bbox=[50, 4, 20, 10]),
    lambda d: d["annotations"][0].update(category_id=2),
])
def test_cli_prints_one_line_and_exits_2(tmp_path, _bad, capsys, edit):
    ann, root = _bad(edit)
    preds = tmp_path / "preds.json"
    preds.write_text("[]")
    assert cli.main(["eval", "--predictions", str(preds), "--annotations", str(ann)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("laplacianformer detect: error: ") and str(ann) in err and "\n" not in err
    assert "Traceback" not in err


def test_cli_train_reports_a_missing_image_file_before_building_anything(tmp_path, _bad, write_coco, capsys):
    data = copy.deepcopy(GOOD)
    write_coco(tmp_path, data, {"a.png": (64, 48)})
    (tmp_path / "annotations" / "instances_train.json").write_text(json.dumps(data))
    (tmp_path / "train").mkdir()
    rc = cli.main(["train", "--data", str(tmp_path), "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert rc == 2 and "instances_train.json: image id 1: image file" in err and "a.png does not exist" in err
    assert not (tmp_path / "run" / "checkpoint.safetensors").exists()


def test_bad_results_file_names_the_entry(tmp_path, _bad, write_coco, capsys):
    ann, root = write_coco(tmp_path, copy.deepcopy(GOOD), FILES)
    preds = tmp_path / "preds.json"
    preds.write_text(json.dumps([{"image_id": 1, "category_id": 3, "bbox": [4, 4, 20, 10], "score": 0.9},
                                 {"image_id": 9, "category_id": 3, "bbox": [4, 4, 20, 10], "score": 0.9}]))
    assert cli.main(["eval", "--predictions", str(preds), "--annotations", str(ann)]) == 2
    assert f"{preds}: entry 1: image_id 9 is not in the ground truth" in capsys.readouterr().err
