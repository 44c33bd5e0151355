"""``add_detect_parser`` parsing and help; builders reject unknown keyword arguments."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

from laplacianformer.detection import cli, fpn_backbone, mask_rcnn, retinanet
from laplacianformer.detection.builders import build_detector


def _parser():
    parent = argparse.ArgumentParser(prog="laplacianformer")
    add = parent.add_subparsers(dest="command", required=True)
    cli.add_detect_parser(add)
    return parent


def test_parser_parses_the_three_sub_commands():
    p = _parser()
    a = p.parse_args(["detect", "train", "--data", "D", "--detector", "maskrcnn", "--backbone", "laplacianformer_tiny",
                      "--img-size", "512", "--epochs", "3", "--max-steps", "7", "--amp", "bf16", "--no-progress",
                      "--backbone-kwargs", '{"attn": "gaussian"}', "--out", "R"])
    assert a.handler is cli.cmd_train and a.detect_command == "train"
    assert cli._given(a) == {"data": "D", "detector": "maskrcnn", "backbone": "laplacianformer_tiny", "img_size": 512,
                             "epochs": 3, "max_steps": 7, "amp": "bf16", "progress": False,
                             "backbone_kwargs": {"attn": "gaussian"}}
    a = p.parse_args(["detect", "eval", "--predictions", "r.json", "--annotations", "i.json", "--json", "m.json"])
    assert a.handler is cli.cmd_eval and a.run is None
    a = p.parse_args(["detect", "predict", "--run", "R", "a.png", "b.png", "--out", "O", "--score-threshold", "0.3"])
    assert a.handler is cli.cmd_predict and a.images == ["a.png", "b.png"] and a.score_threshold == 0.3


@pytest.mark.parametrize("argv", [
    ["detect", "train", "--out", "R", "--img-size", "0"],
    ["detect", "train", "--out", "R", "--detector", "yolo"],
    ["detect", "train", "--out", "R", "--backbone-kwargs", "[1]"],
    ["detect", "predict", "--run", "R", "--out", "O"],  # no image
])
def test_bad_flags_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        _parser().parse_args(argv)
    assert e.value.code == 2


def test_help_lists_the_commands(capsys):
    with pytest.raises(SystemExit):
        _parser().parse_args(["detect", "--help"])
    out = capsys.readouterr().out
    assert "train" in out and "eval" in out and "predict" in out
    with pytest.raises(SystemExit):
        _parser().parse_args(["detect", "train", "--help"])
    out = capsys.readouterr().out
    assert "--backbone-kwargs" in out and "--resume" in out and "--max-steps" in out


def test_unknown_backbone_is_a_one_line_error(tmp_path, capsys):
    assert cli.main(["train", "--data", str(tmp_path), "--backbone", "vit_huge", "--out", str(tmp_path / "r")]) == 2
    assert "backbone: expected one of" in capsys.readouterr().err


def test_builders_reject_unknown_keyword_arguments():
    with pytest.raises(ValueError, match=r"^retinanet: unknown keyword argument\(s\) \['min_szie'\]"):
        retinanet("laplacianformer_micro", 3, min_szie=128)
    with pytest.raises(ValueError, match=r"^mask_rcnn: unknown keyword argument\(s\) \['box_thresh'\]"):
        mask_rcnn("laplacianformer_micro", 3, box_thresh=0.1)
    with pytest.raises(ValueError, match=r"^model_kwargs: unknown keyword argument\(s\) \['atn'\]"):
        fpn_backbone("laplacianformer_micro", atn="gaussian")
    with pytest.raises(ValueError, match=r"^model_kwargs: unknown keyword argument\(s\) \['atn'\]"):
        retinanet("laplacianformer_micro", 3, model_kwargs={"atn": "gaussian"})


@pytest.mark.parametrize("backbone,kwargs", [
    ("resnet18", {}),
    ("laplacianformer_micro", {"attn": "softmax"}),
    ("laplacianformer_micro", {"attn": "gaussian"}),
])
def test_reference_and_attention_variants_build_and_run(backbone, kwargs):
    torch.manual_seed(0)
    model = build_detector("retinanet", backbone, 4, img_size=96, fpn_channels=16, backbone_kwargs=kwargs).eval()
    with torch.no_grad():
        out = model([torch.rand(3, 96, 64)])
    assert model.transform.min_size == (96,) and model.transform.max_size == 96
    assert set(out[0]) == {"boxes", "scores", "labels"}


def test_detector_kwargs_are_validated():
    from laplacianformer.detection.engine import DetectConfig, build_model

    with pytest.raises(ValueError, match=r"detector_kwargs: \['min_size'\] are set by img_size"):
        DetectConfig(data="D", detector_kwargs={"min_size": 10}).validate()
    cfg = DetectConfig(data="D", detector="maskrcnn", backbone="laplacianformer_micro", fpn_channels=16, img_size=64,
                       detector_kwargs={"box_batch_size_per_image": 32})
    assert build_model(cfg.validate(), 3).roi_heads.fg_bg_sampler.batch_size_per_image == 32
    with pytest.raises(ValueError, match=r"^mask_rcnn: unknown keyword argument\(s\) \['box_batch'\]"):
        build_model(DetectConfig(data="D", detector="maskrcnn", backbone="laplacianformer_micro",
                                 detector_kwargs={"box_batch": 32}), 3)
