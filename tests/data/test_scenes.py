"""FashionScenes (data/scenes.py): determinism, COCO validity (checked with pycocotools), provenance of the
items, background texture, argument errors and the command line. Scenes are 128 px and few, drawn from a
small fake Fashion-MNIST written to tmp (train labels 0..4, test labels 5..9, so the split shows in the
categories); one test uses the real files when they are installed."""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import struct
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from laplacianformer.data import DataError, scenes
from laplacianformer.data.fashion_mnist import CLASSES, find_fashion_mnist, load_fashion_mnist

pytestmark = pytest.mark.filterwarnings("ignore:__array__ implementation:DeprecationWarning")  # pycocotools

SMALL = dict(size=128, train=5, val=3, max_items=6, max_scale=3.0, progress=False)


def _write_idx(path: Path, arr: np.ndarray) -> None:
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def _fake_items(rng: np.random.Generator, n: int) -> np.ndarray:
    """(n, 28, 28) uint8: a bright random rectangle with a darker ellipse hole, on black."""
    out = np.zeros((n, 28, 28), dtype=np.uint8)
    yy, xx = np.mgrid[:28, :28]
    for i in range(n):
        y0, x0 = rng.integers(1, 10, size=2)
        y1, x1 = rng.integers(18, 27, size=2)
        out[i, y0:y1, x0:x1] = rng.integers(90, 256)
        cy, cx = rng.integers(10, 18, size=2)
        out[i][(yy - cy) ** 2 + (xx - cx) ** 2 < 9] = 10
    return out


@pytest.fixture(scope="module")
def fake_root(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("fashion")
    rng = np.random.default_rng(0)
    for stem, n, labels in (("train", 40, np.arange(40) % 5), ("t10k", 30, 5 + np.arange(30) % 5)):
        _write_idx(d / f"{stem}-images-idx3-ubyte.gz", _fake_items(rng, n))
        _write_idx(d / f"{stem}-labels-idx1-ubyte.gz", labels)
    return d


@pytest.fixture(scope="module")
def scene_dir(tmp_path_factory, fake_root) -> Path:
    out = tmp_path_factory.mktemp("scenes") / "a"
    scenes.make_scenes(out, seed=0, data_root=fake_root, **SMALL)
    return out


def _files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _load(root: Path, split: str) -> dict:
    return json.loads((root / "annotations" / f"instances_{split}.json").read_text())


# ---------------------------------------------------------------------------------------------------


def test_layout_and_json_fields(scene_dir):
    assert sorted(_files(scene_dir)) == (
        ["annotations/instances_train.json", "annotations/instances_val.json"]
        + [f"train/{i:06d}.png" for i in range(5)] + [f"val/{i:06d}.png" for i in range(3)])
    for split, n in (("train", 5), ("val", 3)):
        d = _load(scene_dir, split)
        assert [c["id"] for c in d["categories"]] == list(range(1, 11))
        assert [c["name"] for c in d["categories"]] == list(CLASSES)
        assert d["info"]["settings"]["seed"] == 0 and d["info"]["settings"]["size"] == 128
        assert [im["id"] for im in d["images"]] == list(range(1, n + 1))
        for im in d["images"]:
            assert (im["width"], im["height"]) == (128, 128)
            png = Image.open(scene_dir / split / im["file_name"])
            assert png.mode == "L" and png.size == (128, 128)
        assert [a["id"] for a in d["annotations"]] == list(range(1, len(d["annotations"]) + 1))


def test_same_seed_byte_identical_other_seed_differs(tmp_path, scene_dir, fake_root):
    scenes.make_scenes(tmp_path / "b", seed=0, data_root=fake_root, **SMALL)
    a, b = _files(scene_dir), _files(tmp_path / "b")
    assert a.keys() == b.keys()
    for name in a:
        assert a[name] == b[name], name
    scenes.make_scenes(tmp_path / "c", seed=1, data_root=fake_root, **SMALL)
    c = _files(tmp_path / "c")
    assert all(a[name] != c[name] for name in a if name.endswith(".png"))
    assert _load(scene_dir, "train")["annotations"] != _load(tmp_path / "c", "train")["annotations"]


def test_scene_depends_only_on_seed_split_and_index(scene_dir, fake_root):
    """Order independence: scene 3 rendered on its own equals file 3 of the set."""
    x, y = load_fashion_mnist("train", fake_root)
    img, items = scenes.render_scene(x, y, scenes.scene_rng(0, "train", 3), size=128, max_items=6,
                                     max_scale=3.0)
    np.testing.assert_array_equal(img, np.asarray(Image.open(scene_dir / "train" / "000003.png")))
    anns = [a for a in _load(scene_dir, "train")["annotations"] if a["image_id"] == 4]
    assert [a["segmentation"] for a in anns] == [scenes.rle_encode(it["mask"]) for it in items]


@pytest.mark.parametrize("max_overlap", [0.0, 0.3, 1.0])
def test_overlap_rule(fake_root, max_overlap):
    """A placed item keeps >= (1 - max_overlap) of its mask visible (all of it at 0); masks are disjoint."""
    x, y = load_fashion_mnist("train", fake_root)
    hidden = 0
    for i in range(4):
        _, items = scenes.render_scene(x, y, scenes.scene_rng(5, "train", i), size=128, min_items=6,
                                       max_items=8, max_scale=3.0, max_overlap=max_overlap)
        assert len(items) >= 2
        assert sum(it["mask"].astype(int) for it in items).max() <= 1
        for it in items:
            vis = int(it["mask"].sum())
            assert vis >= 32 and vis >= (1 - max_overlap) * it["full_area"]
            hidden += it["full_area"] - vis
    assert (hidden == 0) == (max_overlap == 0)


def test_coco_validity_with_pycocotools(scene_dir):
    pytest.importorskip("pycocotools")
    from pycocotools import mask as mask_utils
    from pycocotools.coco import COCO

    n_anns = 0
    for split, source, labels in (("train", "train", range(0, 5)), ("val", "test", range(5, 10))):
        with contextlib.redirect_stdout(io.StringIO()):
            coco = COCO(str(scene_dir / "annotations" / f"instances_{split}.json"))
        for img_id, im in coco.imgs.items():
            union = np.zeros((im["height"], im["width"]), dtype=np.int32)
            for a in coco.loadAnns(coco.getAnnIds(imgIds=[img_id])):
                n_anns += 1
                m = coco.annToMask(a).astype(bool)
                np.testing.assert_array_equal(m, mask_utils.decode(a["segmentation"]).astype(bool))
                np.testing.assert_array_equal(m, scenes.rle_decode(a["segmentation"]))
                assert a["segmentation"]["size"] == [im["height"], im["width"]]
                x, y, w, h = a["bbox"]
                assert all(isinstance(v, float) for v in a["bbox"])
                assert w > 0 and h > 0 and x >= 0 and y >= 0
                assert x + w <= im["width"] and y + h <= im["height"]
                rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
                assert [x, y, w, h] == [cols[0], rows[0], cols[-1] - cols[0] + 1, rows[-1] - rows[0] + 1]
                assert mask_utils.toBbox(a["segmentation"]).tolist() == a["bbox"]
                assert a["area"] == int(m.sum()) == int(mask_utils.area(a["segmentation"]))
                assert a["area"] >= 32 and a["iscrowd"] == 0
                assert a["category_id"] - 1 in labels  # fake train labels 0..4, test labels 5..9
                assert a["source"]["split"] == source and 0 <= a["source"]["index"] < (40 if source == "train" else 30)
                union += m
            assert union.max() <= 1  # visible masks are disjoint
    assert n_anns > 10


def test_cocoeval_accepts_the_annotations(scene_dir):
    """Ground truth scored against itself gives AP 1 for boxes and masks."""
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO
    from pycocotools.cocoeval import COCOeval

    with contextlib.redirect_stdout(io.StringIO()):
        gt = COCO(str(scene_dir / "annotations" / "instances_train.json"))
        dets = [dict(image_id=a["image_id"], category_id=a["category_id"], bbox=a["bbox"],
                     segmentation=a["segmentation"], score=1.0) for a in gt.dataset["annotations"]]
        dt = gt.loadRes(dets)
        for iou_type in ("bbox", "segm"):
            ev = COCOeval(gt, dt, iou_type)
            ev.evaluate()
            ev.accumulate()
            ev.summarize()
            assert ev.stats[0] == pytest.approx(1.0), iou_type


def test_items_come_from_their_split_of_real_fashion_mnist(tmp_path):
    try:
        find_fashion_mnist()
    except DataError:
        pytest.skip("Fashion-MNIST not installed")
    scenes.make_scenes(tmp_path, size=128, train=2, val=2, max_scale=2.0, progress=False)
    for split, source in (("train", "train"), ("val", "test")):
        _, labels = load_fashion_mnist(source)
        anns = _load(tmp_path, split)["annotations"]
        assert anns
        for a in anns:
            assert a["source"]["split"] == source
            assert a["category_id"] == labels[a["source"]["index"]] + 1


def test_images_without_annotations(tmp_path, fake_root):
    pytest.importorskip("pycocotools")
    from pycocotools.coco import COCO

    scenes.make_scenes(tmp_path, size=128, train=2, val=1, min_items=0, max_items=0, progress=False,
                       data_root=fake_root)
    with contextlib.redirect_stdout(io.StringIO()):
        coco = COCO(str(tmp_path / "annotations" / "instances_train.json"))
    assert len(coco.imgs) == 2 and not coco.anns


def test_background_is_textured_not_black(scene_dir):
    d = _load(scene_dir, "train")
    for im in d["images"]:
        pix = np.asarray(Image.open(scene_dir / "train" / im["file_name"]), dtype=np.float64)
        objects = np.zeros(pix.shape, dtype=bool)
        for a in d["annotations"]:
            if a["image_id"] == im["id"]:
                x, y, w, h = (int(v) for v in a["bbox"])
                objects[max(y - 2, 0):y + h + 2, max(x - 2, 0):x + w + 2] = True
        bg = pix[~objects]
        assert bg.size > 1000
        assert bg.mean() > 20 and bg.std() > 4, (im["file_name"], bg.mean(), bg.std())


def test_resize_is_bilinear_with_half_pixel_centres():
    torch = pytest.importorskip("torch")
    img = np.random.default_rng(0).integers(0, 256, (28, 28))
    for side in (5, 28, 31, 57, 112):
        ours = scenes.resize_bilinear(img, side, side)
        ref = torch.nn.functional.interpolate(torch.tensor(img, dtype=torch.float64)[None, None], size=(side, side),
                                              mode="bilinear", align_corners=False)[0, 0].numpy()
        assert np.abs(ours - ref).max() <= 1.0  # weights are rounded to 1/256


def test_rle_encoder_matches_pycocotools():
    pytest.importorskip("pycocotools")
    from pycocotools import mask as mask_utils

    rng = np.random.default_rng(0)
    edge = [np.zeros((5, 4), bool), np.ones((5, 4), bool), np.eye(6, dtype=bool), np.eye(6, dtype=bool)[::-1]]
    for t in range(60 + len(edge)):
        h, w = (int(v) for v in rng.integers(1, 90, size=2))
        m = rng.random((h, w)) < rng.random()
        if t % 3 == 0:  # long runs (multi-group counts)
            m = np.zeros((h, w), dtype=bool)
            m[rng.integers(0, h):, rng.integers(0, w):] = True
        if t >= 60:  # empty, full, first and last pixel set
            m = edge[t - 60]
            h, w = m.shape
        ours = scenes.rle_encode(m)
        assert ours["counts"] == mask_utils.encode(np.asfortranarray(m.astype(np.uint8)))["counts"].decode()
        assert scenes.decode_counts(ours["counts"]) == scenes.rle_counts(m)
        np.testing.assert_array_equal(scenes.rle_decode(ours), m)
        np.testing.assert_array_equal(scenes.rle_decode({"size": [h, w], "counts": scenes.rle_counts(m)}), m)


@pytest.mark.parametrize("name,value", [
    ("size", 127), ("size", 1025), ("size", 256.0), ("train", -1), ("val", True), ("seed", -3),
    ("min_items", -1), ("max_items", 65), ("min_scale", 0.0), ("max_scale", float("nan")),
    ("max_overlap", 1.5), ("max_overlap", -0.1), ("min_area", 0), ("threshold", 256),
])
def test_argument_errors_name_the_argument(tmp_path, name, value):
    with pytest.raises(ValueError, match=f"^{name}: "):
        scenes.make_scenes(tmp_path, progress=False, **{name: value})
    assert not any(tmp_path.iterdir())


def test_cross_argument_errors(tmp_path, scene_dir):
    with pytest.raises(ValueError, match="^max_items: .*min_items"):
        scenes.make_scenes(tmp_path, min_items=5, max_items=2)
    with pytest.raises(ValueError, match="^max_scale: .*fit"):
        scenes.make_scenes(tmp_path, size=128, max_scale=5.0)
    with pytest.raises(ValueError, match="^max_scale: .*min_scale"):
        scenes.make_scenes(tmp_path, min_scale=2.0, max_scale=1.5)
    with pytest.raises(ValueError, match="^out_dir: .*overwrite"):
        scenes.make_scenes(scene_dir, **SMALL)


def test_cli_help_run_and_flag_errors(tmp_path, fake_root, capsys):
    with pytest.raises(SystemExit) as e:
        scenes.main(["--help"])
    assert e.value.code == 0
    text = capsys.readouterr().out
    for flag in ("--out", "--size", "--train", "--val", "--seed", "--min-items", "--max-items", "--min-scale",
                 "--max-scale", "--max-overlap", "--progress", "--no-progress"):
        assert flag in text
    argv = ["--out", str(tmp_path / "s"), "--size", "128", "--train", "2", "--val", "1", "--max-scale", "2",
            "--data-root", str(fake_root), "--no-progress"]
    assert scenes.main(argv) == 0
    assert "2 train images" in capsys.readouterr().out
    assert scenes.main(argv) == 2  # exists, no --overwrite
    assert "--out: " in capsys.readouterr().err
    assert scenes.main(argv + ["--overwrite"]) == 0
    capsys.readouterr()
    assert scenes.main(argv + ["--overwrite", "--size", "64"]) == 2
    assert "--size: expected an integer in 128..1024, got 64" in capsys.readouterr().err


@pytest.mark.parametrize("size", [128, 131, 1024])
def test_item_fields_agree_with_the_mask(fake_root, size):
    x, y = load_fashion_mnist("test", fake_root)
    img, items = scenes.render_scene(x, y, scenes.scene_rng(2, "val", 0), size=size, min_items=4, max_scale=3.0)
    assert img.shape == (size, size) and img.dtype == np.uint8 and items
    for it in items:
        m = it["mask"]
        rows, cols = np.flatnonzero(m.any(1)), np.flatnonzero(m.any(0))
        assert it["bbox"] == (cols[0], rows[0], cols[-1] - cols[0] + 1, rows[-1] - rows[0] + 1)
        assert it["area"] == m.sum() and it["counts"] == scenes.rle_counts(m)
