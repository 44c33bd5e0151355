"""Checkpoints of timm's train.py (``model_best.pth.tar``: ``state_dict``, ``state_dict_ema``, ``arch``, an
``argparse.Namespace`` in ``args``) and plain ``.pth`` state dicts load through ``from_pretrained`` and
``laplacianformer eval`` (``verify=False`` / ``--no-verify``), weights_only, with the model the file names
or ``--model`` / ``model_name`` (docs/MODELS.md, "Saving and loading")."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import laplacianformer as lf
from laplacianformer.checkpoint import CheckpointError
from laplacianformer.cli import main
from laplacianformer.data import build_eval_dataset
from laplacianformer.models import create_model
from laplacianformer.train import evaluate
from laplacianformer.train.evaluate_run import load_for_eval

NAME = "laplacianformer_micro"
TINY = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}
DIGITS = ["--data", "digits", "--test-subset", "32", "--device", "cpu", "--no-progress"]


class _Marker:
    """Unpickling it would create a file (what a weights_only load must refuse)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def _model(seed: int):
    torch.manual_seed(seed)
    model = create_model(NAME, num_classes=10, in_chans=1, **TINY)
    with torch.no_grad():  # weights no constructor would make, so an equal copy must come from the file
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    return model


def _args(**kw) -> argparse.Namespace:
    """The fields of timm train.py's args that loading reads, and some it does not."""
    base = dict(model=NAME, num_classes=10, img_size=16, input_size=None, in_chans=1, model_kwargs=dict(TINY),
                mean=[0.5], std=[0.25], interpolation="bilinear", crop_pct=1.0, lr=1e-3, epochs=3,
                data_dir="/data/imagenet", model_ema=True, device="cuda:0")
    return argparse.Namespace(**{**base, **kw})


def _state(model, prefix="module."):
    return {prefix + k: v.clone() for k, v in model.state_dict().items()}


def _equal(model, reference) -> bool:
    got, want = model.state_dict(), reference.state_dict()
    return got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


@pytest.fixture(scope="module")
def timm_file(tmp_path_factory):
    """(path, raw model, EMA model) of a timm-style checkpoint written by torch.save (DDP prefixes)."""
    raw, ema = _model(0), _model(1)
    opt = torch.optim.AdamW(raw.parameters(), lr=1e-3)
    raw(torch.randn(2, 1, 16, 16)).sum().backward()
    opt.step()
    opt.zero_grad()
    path = tmp_path_factory.mktemp("timm") / "model_best.pth.tar"
    torch.save({"epoch": 3, "arch": NAME, "state_dict": _state(raw), "optimizer": opt.state_dict(), "version": 2,
                "args": _args(), "metric": 12.5, "state_dict_ema": _state(ema)}, path)
    return path, raw, ema


def test_from_pretrained_loads_the_weights_and_ema_exactly(timm_file):
    path, raw, ema = timm_file
    with pytest.raises(CheckpointError, match="no integrity trailer") as info:
        lf.from_pretrained(path)
    assert "--no-verify" in str(info.value) and "verify=False" in str(info.value)
    model = lf.from_pretrained(path, verify=False)
    assert _equal(model, raw) and model.config["stem_stride"] == 2 and model.num_classes == 10
    cfg = model.pretrained_cfg
    assert cfg["input_size"] == (1, 16, 16) and cfg["mean"] == (0.5,) and cfg["std"] == (0.25,)
    assert _equal(lf.from_pretrained(path, verify=False, ema=True), ema)
    with pytest.warns(UserWarning, match="another num_classes"):  # an override: new head, the rest loaded
        five = lf.from_pretrained(path, verify=False, num_classes=5)
    assert five.num_classes == 5 and torch.equal(five.state_dict()["patch_embed.proj.weight"],
                                                 raw.state_dict()["patch_embed.proj.weight"])


def test_cli_eval_scores_the_saved_weights(timm_file, tmp_path, capsys):
    path, raw, ema = timm_file
    last = None
    for flags, model in (([], raw), (["--ema"], ema)):
        out = tmp_path / ("ema" if flags else "raw")
        assert main(["eval", "--checkpoint", str(path), "--no-verify", *DIGITS, "--out", str(out), *flags]) == 0
        res = json.loads((out / "eval.json").read_text())
        # the CLI's numbers are those of the saved model on the same 32 images
        dataset = build_eval_dataset("digits", 16, in_chans=1, test_subset=32, seed=0)
        want = evaluate(model.eval(), dataset, batch_size=256, device=torch.device("cpu"), num_classes=10,
                        progress=False)
        assert res["n"] == 32 and res["loss"] == pytest.approx(want["loss"], rel=1e-6, abs=1e-7)
        assert res["loss"] != last
        last = res["loss"]
    config, state, _ = load_for_eval(path, verify=False, data="digits")
    assert config.model == NAME and config.img_size == 16 and config.model_kwargs["stem_stride"] == 2
    assert state.keys() == raw.state_dict().keys()
    assert all(torch.equal(state[k], v) for k, v in raw.state_dict().items())
    capsys.readouterr()
    assert main(["eval", "--checkpoint", str(path), *DIGITS, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no integrity trailer" in err and "--no-verify" in err and "Traceback" not in err


def test_config_less_files_need_model_and_data(timm_file, tmp_path, capsys):
    path, raw, _ = timm_file
    plain = tmp_path / "weights.pth"
    torch.save(_state(raw, prefix="_orig_mod.module."), plain)  # torch.compile around DDP
    for argv, flag in ((["--checkpoint", str(plain), "--no-verify", *DIGITS], "--model"),
                       (["--checkpoint", str(plain), "--no-verify", "--model", "vit_tiny", *DIGITS], "--model"),
                       (["--checkpoint", str(path), "--no-verify", "--test-subset", "8"], "--data")):
        assert main(["eval", *argv, "--out", str(tmp_path)]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"laplacianformer: error: {flag}: ") and err.count("\n") == 1, err
    assert main(["eval", "--checkpoint", str(plain), "--no-verify", "--model", NAME, *DIGITS,
                 "--out", str(tmp_path)]) == 2  # the plain dict records no model_kwargs: another architecture
    assert "weights do not fit" in capsys.readouterr().err
    default = tmp_path / "default.pth"  # the name's own architecture: the model name is all eval needs
    torch.save(_state(raw, prefix=""), default)
    config, state, _ = load_for_eval(default, verify=False, model=NAME, data="digits")
    assert (config.model, config.img_size, config.model_kwargs) == (NAME, 224, {"stem_stride": 4})
    assert all(torch.equal(state[k], v) for k, v in raw.state_dict().items())
    with pytest.raises(FileNotFoundError, match="pass model_name="):
        lf.from_pretrained(plain, verify=False)
    assert _equal(lf.from_pretrained(plain, verify=False, model_name=NAME, **TINY), raw)
    with pytest.raises(ValueError, match="^ema: "):
        lf.from_pretrained(plain, verify=False, model_name=NAME, ema=True, **TINY)
    other = tmp_path / "resnet.pth.tar"
    torch.save({"arch": "resnet50", "state_dict": _state(raw), "args": _args(model="resnet50")}, other)
    with pytest.raises(FileNotFoundError, match="its arch 'resnet50' is not one"):
        lf.from_pretrained(other, verify=False)
    no_ema = tmp_path / "last.pth.tar"
    torch.save({"arch": NAME, "state_dict": _state(raw), "args": _args()}, no_ema)
    with pytest.raises(CheckpointError, match="no state_dict_ema"):
        lf.from_pretrained(no_ema, verify=False, ema=True)


def test_code_in_the_pickle_is_refused_and_damage_reported(timm_file, tmp_path, capsys):
    path, raw, _ = timm_file
    evil = tmp_path / "evil.pth.tar"
    torch.save({"arch": NAME, "state_dict": _state(raw), "args": _args(), "saver": _Marker(tmp_path / "PWNED")}, evil)
    with pytest.raises(CheckpointError, match="refused pickle"):
        lf.from_pretrained(evil, verify=False)
    assert main(["eval", "--checkpoint", str(evil), "--no-verify", *DIGITS, "--out", str(tmp_path)]) == 2
    assert "refused pickle" in capsys.readouterr().err
    assert not (tmp_path / "PWNED").exists()
    cut = tmp_path / "cut.pth.tar"
    data = path.read_bytes()
    cut.write_bytes(data[: len(data) - 200])  # without the trailer only torch.load's own checks remain
    with pytest.raises(CheckpointError, match="^checkpoint: .*cut.pth.tar: "):
        lf.from_pretrained(cut, verify=False)


def test_files_written_by_timms_checkpoint_saver(tmp_path):
    """The writer train.py uses (timm.utils.CheckpointSaver with a ModelEmaV3), one epoch's files."""
    timm = pytest.importorskip("timm")
    from timm.utils import CheckpointSaver, ModelEmaV3

    torch.manual_seed(0)
    model = timm.create_model(NAME, num_classes=10, in_chans=1, **TINY)
    ema = ModelEmaV3(model, decay=0.5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(2, 1, 16, 16)).sum().backward()
    opt.step()
    ema.update(model)
    saver = CheckpointSaver(model, opt, args=_args(), model_ema=ema, checkpoint_dir=str(tmp_path),
                            recovery_dir=str(tmp_path), max_history=2)
    saver.save_checkpoint(epoch=0, metric=10.0)
    best = tmp_path / "model_best.pth.tar"
    assert best.is_file() and (tmp_path / "last.pth.tar").is_file()
    assert _equal(lf.from_pretrained(best, verify=False), model)
    assert _equal(lf.from_pretrained(best, verify=False, ema=True), ema.module)
    assert not _equal(ema.module, model)
