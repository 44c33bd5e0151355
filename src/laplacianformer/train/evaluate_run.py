"""Evaluate a saved run: ``evaluate_checkpoint(run_dir_or_file)`` -> metrics, ``eval.json``, ``confusion.png``.

Without ``data`` the run's own test split is scored (its data path resolved from any working directory:
``config.resolve_data``); with ``data`` = an image folder, every image of that folder is scored
(``data.build_eval_dataset``: its ``val/``/``test/`` split when it has one), its class folders matched by
name to the classes the model was trained on, each image read with the model's preprocessing
(``preprocess.Preprocessing`` of its saved pretrained cfg: the run's mean / std and whole-image resize,
the code ``laplacianformer predict`` uses).

A weights file that records no training config (a timm ``train.py`` checkpoint such as
``model_best.pth.tar``, a plain ``.pth`` state dict, safetensors weights without a run beside them) is read
with ``hub.read_weights`` (``verify=False`` / ``--no-verify`` for files without the integrity trailer); the
model is the one the file names (timm's ``arch``) or ``model``, the data set must be given (``data``).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

from ..checkpoint import CheckpointError, read_metadata
from ..data import BUILTIN, DataError, build_datasets, build_eval_dataset
from ..hub import (
    CHECKPOINT_NAME, EMA_WEIGHTS_NAME, TRAIN_CONFIG_NAME, WEIGHTS_NAME, WeightsFile, load_model_state,
    read_run_checkpoint, read_weights, weights_config,
)
from ..models.laplacianformer import LaplacianFormer, default_cfgs
from ..models.registry import list_models
from .config import TrainConfig, read_train_config, resolve_data, saved_config
from .engine import build_model, resolve_device
from .evaluate import evaluate
from .plots import plot_confusion
from .preprocess import ImageFiles, Preprocessing


def _is_training_checkpoint(file: Path) -> bool:
    """A training checkpoint (``checkpoint.safetensors``, its ``.prev``, or any file that is not plain
    safetensors weights) rather than a weights file."""
    if file.name.endswith(".prev") or file.name == CHECKPOINT_NAME:
        return True
    return file.suffix == ".safetensors" and "state" in read_metadata(file)


def _has_train_config(file: Path) -> bool:
    """Whether the weights ``file`` has a training config: in its safetensors metadata or beside it."""
    if file.suffix == ".safetensors" and "train_config" in read_metadata(file):
        return True
    return (file.parent / TRAIN_CONFIG_NAME).is_file()


def _config_of_file(wf: WeightsFile, model: str | None, data: str | None) -> TrainConfig:
    """The config that evaluates ``wf``, a weights file without a training config: the model it names (or
    ``model``) as timm built it (its ``args.model_kwargs``; the constructor's stem stride, not the small-image
    rule of ``geometry.model_kwargs_for``), at its training image size (else the name's default cfg's)."""
    name = model or wf.model
    if name is None:
        said = f"its arch {wf.arch!r} is not a model of this family" if wf.arch else "it names no model"
        raise ValueError(f"model: {wf.path} has no training config and {said}: pass the registered name "
                         f"(one of {list_models()})")
    if name not in list_models():
        raise ValueError(f"model: expected one of {list_models()}, got {name!r}")
    if data is None:
        raise ValueError(f"data: {wf.path} has no training config, so no data set to score: pass a built-in set "
                         "or an image folder")
    kwargs = {k: v for k, v in wf.kwargs.items() if k not in ("num_classes", "in_chans")}  # from the data / weights
    attn, attn_kwargs = kwargs.pop("attn", "laplacian"), kwargs.pop("attn_kwargs", None) or {}
    kwargs.setdefault("stem_stride", inspect.signature(LaplacianFormer).parameters["stem_stride"].default)
    size = wf.img_size if wf.img_size is not None else default_cfgs[name]["input_size"][1:]
    img = size if isinstance(size, int) else max(size)  # eval resizes to a square
    return TrainConfig(model=name, attn=attn, attn_kwargs=dict(attn_kwargs), model_kwargs=kwargs, data=data,
                       img_size=img, drop_path=0.0)


def load_for_eval(path: str | Path, *, ema: bool = False, verify: bool = True, model: str | None = None,
                  data: str | None = None) -> tuple[TrainConfig, dict, Path]:
    """(config, model state dict, file read): ``_load`` without the pretrained cfg."""
    return _load(path, ema=ema, verify=verify, model=model, data=data)[:3]


def _load(path: str | Path, *, ema: bool = False, verify: bool = True, model: str | None = None,
          data: str | None = None) -> tuple[TrainConfig, dict, Path, dict | None]:
    """(config, model state dict, file read, pretrained cfg or None) from a run directory, a training
    checkpoint (``checkpoint.safetensors``) or a weights file.

    A run directory gives ``model.safetensors`` (``model_ema.safetensors`` with ``ema``), else its training
    checkpoint (``hub.read_run_checkpoint``: the previous file when the latest is damaged). A weights file's
    training config is its metadata's, else the ``train_config.json`` beside it; a file with neither (a timm
    checkpoint, a plain state dict: ``hub.read_weights`` with ``ema`` and ``verify``) is evaluated as
    ``_config_of_file`` says, which needs ``data`` and, unless the file names its model, ``model``.
    The pretrained cfg (preprocessing) is the saved model's (``hub.weights_config``), else for a file of
    another origin the family's default with the entries the file records (timm's ``args``), else None."""
    p = Path(path)
    if p.is_dir():
        if ema:
            if not (p / EMA_WEIGHTS_NAME).exists():
                raise CheckpointError(f"checkpoint: {p}: no {EMA_WEIGHTS_NAME} in this directory")
            p = p / EMA_WEIGHTS_NAME
        elif (p / WEIGHTS_NAME).exists():
            p = p / WEIGHTS_NAME
    elif not p.exists():
        raise CheckpointError(f"checkpoint: {p}: no such file or directory")
    if p.is_dir() or _is_training_checkpoint(p):
        file, obj = read_run_checkpoint(p)
        state = obj["model"]
        if ema:
            if not obj.get("ema"):
                raise CheckpointError(f"checkpoint: {file}: the run kept no EMA weights (trained without --ema)")
            state = obj["ema"]["shadow"]
        return TrainConfig.from_dict(saved_config(obj["config"])), state, file, _saved_cfg(file)
    wf = read_weights(p, ema=ema, verify=verify)
    if not _has_train_config(p):
        config = _config_of_file(wf, model, data)
        cfg = _saved_cfg(p) or dict(default_cfgs[config.model], **wf.pretrained_cfg)
        return config, wf.state, p, cfg
    saved = read_metadata(p).get("train_config") if p.suffix == ".safetensors" else None
    config = TrainConfig.from_dict(saved_config(json.loads(saved))) if saved else read_train_config(p.parent)
    return config, wf.state, p, _saved_cfg(p)


def _saved_cfg(file: Path) -> dict | None:
    """The pretrained cfg of the saved model that describes ``file`` (``hub.weights_config``), or None."""
    saved = weights_config(file)
    return dict(saved["pretrained_cfg"]) if saved and saved.get("pretrained_cfg") else None


def run_classes(file: Path) -> list[str] | None:
    """The class names (label order) of the weights in ``file``: its safetensors metadata, the training
    checkpoint, or the ``label_names`` of its saved-model config (``hub.weights_config``); None when none
    records them."""
    file = Path(file)
    if _is_training_checkpoint(file):
        names = read_run_checkpoint(file)[1].get("classes")
    elif file.suffix == ".safetensors":
        names = json.loads(read_metadata(file).get("classes") or "null")
    else:  # a torch.save file (timm checkpoint, state dict): no class names
        names = None
    if not names:
        names = ((weights_config(file) or {}).get("pretrained_cfg") or {}).get("label_names")
    return [str(c) for c in names] if names else None


def _head_rows(state: dict) -> int | None:
    head = state.get("head.weight")
    return None if head is None else int(head.shape[0])


def evaluate_checkpoint(path, *, data: str | None = None, model: str | None = None, test_subset: int | None = None,
                        batch_size: int = 256, amp: str = "off", ema: bool = False, verify: bool = True,
                        out: str | Path | None = None, device: str = "auto", progress: bool = True) -> dict:
    """Evaluates a saved model on the test split of its own data set, or on ``data``.

    ``data``: a built-in set (its test split) or an image folder, of which EVERY image is scored (its
    ``val/`` or ``test/`` split when it has one, else all ``<class>/`` folders); the folder's classes are
    matched by name to the model's (a subset is fine; DataError for a class the model lacks).
    ``model``: the registered name to build instead of the stored one (required for a weights file that
    names none). ``verify=False``: accept a ``torch.save`` file without the integrity trailer (a timm
    ``train.py`` checkpoint, a ``.pth`` state dict), still read with ``weights_only=True``.
    Returns the ``evaluate`` dict plus ``classes`` (the model's), ``data``, ``json`` and ``confusion_png``
    (paths written). ``progress``: True -> a bar on a terminal, else a line at least every 30 s.
    """
    if data is not None and data not in BUILTIN and Path(data).expanduser().is_file():
        raise DataError(f"data: {data} is a file; eval scores a folder of class folders (classify single images "
                        f"with `laplacianformer predict --run RUN {data}`)")
    config, state, file, cfg = _load(path, ema=ema, verify=verify, model=model, data=data)
    if model is not None:
        config.model = model
    config.test_subset = test_subset
    if data is None:
        config.data = resolve_data(config.data)
        splits = build_datasets(config.data, config.img_size, in_chans=config.in_chans, train_subset=1,
                                test_subset=test_subset, seed=config.seed, check_images=config.verify_images)
        dataset, classes, in_chans = splits.test, splits.classes, splits.in_chans
    else:
        config.data = data if data in BUILTIN else str(Path(data).expanduser().resolve())
        classes = run_classes(file)
        if classes is None and config.data not in BUILTIN:
            # weights without recorded class names: the folder's sorted classes, if the head fits them
            classes = build_eval_dataset(config.data, 8, classes=None, check_images=False).classes
            if _head_rows(state) not in (None, len(classes)):
                raise CheckpointError(f"checkpoint: {file}: has {_head_rows(state)} classes and no class names; "
                                      f"{config.data} has {len(classes)} class folders")
        conv = state.get("patch_embed.proj.weight")
        in_chans = int(conv.shape[1]) if conv is not None else config.in_chans
        dataset = build_eval_dataset(config.data, config.img_size, in_chans=in_chans, classes=classes,
                                     test_subset=test_subset, seed=config.seed, check_images=config.verify_images)
        classes = dataset.classes
        in_chans = dataset.in_chans if hasattr(dataset, "in_chans") else in_chans
        if cfg is not None and config.data not in BUILTIN:  # the model's preprocessing, as predict reads images
            prep = Preprocessing.from_cfg(dict(cfg, input_size=(in_chans, config.img_size, config.img_size)))
            dataset = ImageFiles(dataset.samples, classes, prep)
    net = build_model(config, len(classes), in_chans)
    load_model_state(net, state, str(file))
    dev = resolve_device(device)
    res = evaluate(net.to(dev), dataset, batch_size=batch_size, device=dev, amp=amp,
                   num_classes=len(classes), progress=progress)
    out_dir = Path(out) if out else file.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    res["classes"] = [str(c) for c in classes]
    res["checkpoint"] = str(file)
    res["data"] = config.data
    res["json"] = str(out_dir / "eval.json")
    res["confusion_png"] = str(out_dir / "confusion.png")
    plot_confusion(res["confusion"], res["classes"], res["confusion_png"],
                   title=f"{config.model} ({config.attn}) on {config.data}: top-1 {100 * res['top1']:.1f}%")
    Path(res["json"]).write_text(json.dumps(res, indent=1) + "\n")
    return res

