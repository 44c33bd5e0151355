"""``laplacianformer.train.predict``: classify image files with a run's own preprocessing (any PIL mode and
size), timm checkpoints with their pretrained cfg (= timm's eval transform), errors naming the file."""

from __future__ import annotations

import argparse

import numpy as np
import pytest
import torch

import laplacianformer as lf
from laplacianformer.checkpoint import CheckpointError
from laplacianformer.data import DataError
from laplacianformer.data.folder import read_image
from laplacianformer.models import create_model
from laplacianformer.train import evaluate, predict, train
from laplacianformer.train.evaluate_run import evaluate_checkpoint
from laplacianformer.train.preprocess import ImageFiles, Preprocessing

from train_helpers import TINY_MODEL, tiny_config


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("predict") / "run"
    train(tiny_config(out, train_subset=32, test_subset=16))
    return out


def _grey(seed: int, size=(13, 20)) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


def _save_modes(folder, a: np.ndarray) -> list:
    """The grey image ``a`` as PNGs in modes L, RGB, RGBA, P (a grey palette) and I;16: the same pixels."""
    from PIL import Image

    folder.mkdir(parents=True, exist_ok=True)
    grey = Image.fromarray(a, "L")
    rgba = grey.convert("RGBA")
    rgba.putalpha(Image.fromarray(255 - a, "L"))  # transparency is dropped, not blended
    pal = Image.fromarray(a, "P")
    pal.putpalette([v for i in range(256) for v in (i, i, i)])
    images = {"l.png": grey, "rgb.png": grey.convert("RGB"), "rgba.png": rgba, "p.png": pal,
              "i16.png": Image.fromarray(a.astype(np.uint16) * 257)}
    for name, im in images.items():
        im.save(folder / name)
    return [folder / name for name in images]


def test_predict_reads_every_mode_with_the_runs_preprocessing(run, tmp_path):
    paths = _save_modes(tmp_path / "imgs", _grey(0))
    preds = predict(run, tmp_path / "imgs", top_k=3, device="cpu")
    assert [p["path"] for p in preds] == sorted(str(p) for p in paths)  # a folder: its images, sorted
    model = lf.from_pretrained(run).eval()
    assert model.pretrained_cfg["mean"] == (0.3,) and model.pretrained_cfg["std"] == (0.4,)  # digits', not 0.5
    x = (read_image(paths[0], 16, 1).float()[None] / 255 - 0.3) / 0.4  # what the run's evaluation does
    with torch.no_grad():
        want = model(x).softmax(1)[0]
    top = want.topk(3)
    for p in preds:
        assert [t["index"] for t in p["top_k"]] == top.indices.tolist(), p["path"]
        assert [t["class"] for t in p["top_k"]] == [str(i) for i in top.indices.tolist()]  # the run's names
        assert [t["prob"] for t in p["top_k"]] == pytest.approx(top.values.tolist(), abs=1e-6), p["path"]
    assert len(predict(run, paths[0], top_k=50)[0]["top_k"]) == 10  # capped at the classes


def test_eval_of_a_folder_reads_images_as_predict_does(run, tmp_path):
    for label in (3, 7):
        _save_modes(tmp_path / "data" / str(label), _grey(label, (8, 8)))
    res = evaluate_checkpoint(run, data=str(tmp_path / "data"), out=tmp_path / "ev", progress=False)
    preds = predict(run, tmp_path / "data", top_k=10)
    nll = [-np.log(next(t["prob"] for t in p["top_k"] if t["class"] == p["path"].split("/")[-2])) for p in preds]
    assert res["n"] == 10 and res["loss"] == pytest.approx(float(np.mean(nll)), rel=1e-5)  # the run's mean/std


def _timm_cfg(**kw) -> dict:
    base = dict(input_size=(3, 24, 24), mean=(0.485, 0.456, 0.406), std=(0.229, 0.224, 0.225),
                interpolation="bicubic", crop_pct=0.9)
    return {**base, **kw}


@pytest.mark.parametrize("cfg", [_timm_cfg(), _timm_cfg(crop_mode="squash", interpolation="bilinear", crop_pct=0.875),
                                 _timm_cfg(input_size=(1, 20, 20), mean=(0.5,), std=(0.25,), crop_pct=1.0,
                                           crop_mode="center")])
def test_other_cfgs_follow_timms_eval_transform(cfg, tmp_path):
    timm_data = pytest.importorskip("timm.data")
    pytest.importorskip("torchvision")
    from PIL import Image

    prep = Preprocessing.from_cfg(cfg)
    assert not prep.whole_image
    config = timm_data.resolve_data_config({}, pretrained_cfg=cfg)
    transform = timm_data.create_transform(**config, is_training=False)
    rgb = np.random.default_rng(1).integers(0, 256, size=(37, 51, 3), dtype=np.uint8)
    for i, im in enumerate((Image.fromarray(rgb), Image.fromarray(rgb).transpose(Image.Transpose.TRANSPOSE))):
        im.save(tmp_path / f"{i}.png")
        ours = prep.normalize(prep.read(tmp_path / f"{i}.png")[None])[0]
        theirs = transform(im.convert("L" if prep.in_chans == 1 else "RGB"))
        assert ours.shape == theirs.shape == (prep.in_chans, *prep.size)
        torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=0)


def test_timm_checkpoint_uses_its_cfg_and_needs_no_verify(tmp_path):
    torch.manual_seed(0)
    model = create_model("laplacianformer_micro", num_classes=4, in_chans=1, **TINY_MODEL)
    args = argparse.Namespace(model="laplacianformer_micro", img_size=16, model_kwargs=dict(TINY_MODEL),
                              mean=[0.5], std=[0.25], interpolation="bicubic", crop_pct=0.8)
    path = tmp_path / "model_best.pth.tar"
    torch.save({"arch": "laplacianformer_micro", "state_dict": model.state_dict(), "args": args}, path)
    from PIL import Image

    Image.fromarray(_grey(2, (30, 40)), "L").convert("P").save(tmp_path / "a.png")
    with pytest.raises(CheckpointError, match="no integrity trailer"):
        predict(path, tmp_path / "a.png")
    (pred,) = predict(path, tmp_path / "a.png", verify=False, top_k=4)
    prep = Preprocessing(1, (16, 16), (0.5,), (0.25,), "bicubic", 0.8, "center")  # the args' preprocessing
    with torch.no_grad():
        want = model.eval()(prep.normalize(prep.read(tmp_path / "a.png")[None])).softmax(1)[0]
    assert [t["class"] for t in pred["top_k"]] == [str(i) for i in want.argsort(descending=True).tolist()]
    assert sorted(t["prob"] for t in pred["top_k"]) == pytest.approx(sorted(want.tolist()), abs=1e-6)


def test_bad_inputs_name_the_argument_or_file(run, tmp_path):
    (tmp_path / "bad.png").write_bytes(b"\x89PNG\r\n\x1a\n not an image")
    with pytest.raises(DataError, match=f"^{tmp_path / 'bad.png'}: cannot read image"):
        predict(run, [tmp_path / "bad.png"])
    with pytest.raises(DataError, match="no such image file or folder"):
        predict(run, tmp_path / "missing.png")
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no image files in this folder"):
        predict(run, tmp_path / "empty")
    with pytest.raises(ValueError, match="^top_k: "):
        predict(run, tmp_path / "bad.png", top_k=0)
    with pytest.raises(FileNotFoundError, match="^model_or_run: "):
        predict(tmp_path / "no-run", tmp_path / "bad.png")
    with pytest.raises(ValueError, match="^model_or_run: Linear has no pretrained_cfg"):
        predict(torch.nn.Linear(2, 2), tmp_path / "bad.png")
    with pytest.raises(ValueError, match="^pretrained_cfg: crop_pct: "):
        Preprocessing.from_cfg(_timm_cfg(crop_pct=1.5))
    ds = ImageFiles([(tmp_path / "bad.png", 0)], ["a"], Preprocessing.from_cfg(_timm_cfg()))
    with pytest.raises(DataError, match="bad.png: cannot read image"):
        evaluate(torch.nn.Identity(), ds)
