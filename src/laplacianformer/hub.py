"""Saving and loading models, one layer above ``laplacianformer.models`` (which never imports this module).

    from laplacianformer import from_pretrained, save_pretrained
    save_pretrained(model, "runs/tiny")                # config.json + model.safetensors
    model = from_pretrained("runs/tiny")               # a saved model ...
    model = from_pretrained("runs/micro-laplacian")    # ... or a training run directory
    ft = from_pretrained("runs/tiny", num_classes=5)   # constructor overrides (new head, other variant)

Functions, not model methods (as ``timm.create_model``): the model classes stay free of file formats.
This module is the one reader of saved-model configs (``read_config``, ``weights_config``); the models'
timm entry points get the config of a weights file through ``weights_config``, which this module hands to
``models.laplacianformer.set_weights_config_reader`` on import (the models never import it).

File names, one meaning each (in a saved-model directory and in a training run directory alike):

- ``config.json``: a saved model: ``{"format": "laplacianformer/1", "architecture": "LaplacianFormer",
  "config": <constructor arguments>, "pretrained_cfg": <timm pretrained cfg: input_size, mean, std,
  interpolation, crop_pct, num_classes, label_names, ...>}``.
- ``model.safetensors``: that model's weights (in a run directory: the weights at the end of the run).
- ``train_config.json``: the settings of a training run (``laplacianformer.train.TrainConfig``).
- ``checkpoint.safetensors`` (+ ``.prev``, the one before): the full training state of the run's latest
  checkpoint (``checkpoint.save_training_state``).
- ``model_best.safetensors``: the run's weights with the best test top-1 at an epoch end (the weights that
  were evaluated: the EMA weights with ``--ema``). ``model_ema.safetensors``: the EMA weights at the end.

Runs of laplacianformer before 0.1 kept their training state in ``checkpoint.pt`` and their training
settings in ``config.json``; those layouts are not read, and meeting one is an error that says what to do
(``old_layout``).

Weights are written atomically with an integrity hash (``checkpoint.save_weights``) and read with
``checkpoint.load_checkpoint``, which reads safetensors and never unpickles code.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from .checkpoint import (
    CheckpointError, load_checkpoint, load_training_state, previous_path, read_metadata, save_weights,
)
from .models.laplacianformer import LaplacianFormer, checkpoint_filter_fn, default_cfgs, set_weights_config_reader
from .models.registry import list_models

__all__ = [
    "save_pretrained",
    "from_pretrained",
    "read_config",
    "weights_config",
    "write_config",
    "is_run_dir",
    "run_weights",
    "read_run_checkpoint",
    "old_layout",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "TRAIN_CONFIG_NAME",
    "CHECKPOINT_NAME",
    "BEST_WEIGHTS_NAME",
    "EMA_WEIGHTS_NAME",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAIN_CONFIG_NAME = "train_config.json"
CHECKPOINT_NAME = "checkpoint.safetensors"
BEST_WEIGHTS_NAME = "model_best.safetensors"
EMA_WEIGHTS_NAME = "model_ema.safetensors"
FORMAT = "laplacianformer/1"
TRAIN_FORMAT = "laplacianformer.train/1"  # the ``format`` of a classification training checkpoint
_OLD_CHECKPOINT_NAME = "checkpoint.pt"  # the training checkpoint before 0.1: named only to refuse it
# pretrained-cfg entries that timm holds as tuples (JSON stores them as lists)
_TUPLE_KEYS = ("input_size", "pool_size", "mean", "std", "label_names", "test_input_size", "min_input_size")


def old_layout(what: str) -> str:
    """The error text for ``what``, a file layout of laplacianformer before 0.1, which is no longer read."""
    return (f"{what} is a layout of laplacianformer before 0.1, no longer read: retrain, or load the run with a "
            "checkout up to commit 1fe4d21 and save_pretrained its model")


def _jsonable_cfg(cfg: Mapping) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items() if _is_json(v)}


def _is_json(v) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def _fit_cfg(cfg: Mapping | None, model: LaplacianFormer) -> dict:
    """``cfg`` (default: the family's) made to describe ``model``'s weights: its class count (class names
    dropped when that changes) and input channels."""
    cfg = dict(cfg) if cfg else dict(default_cfgs[list_models()[0]], architecture=None)
    if cfg.get("num_classes") != model.num_classes:
        cfg.update(num_classes=model.num_classes, label_names=None)
    size = cfg.get("input_size") or (3, 224, 224)
    cfg["input_size"] = (model.in_chans, *size[1:])
    return cfg


def write_config(model: LaplacianFormer, path: str | os.PathLike, pretrained_cfg: Mapping | None = None) -> Path:
    """Write ``config.json`` (constructor arguments + pretrained cfg) of ``model`` into the directory ``path``.

    pretrained_cfg: the preprocessing of the weights (default: ``model.pretrained_cfg``, else the family's);
    its class count and input channels are set to the model's. Returns the file written (atomically).
    """
    if not isinstance(model, LaplacianFormer):
        raise TypeError(f"model: expected a LaplacianFormer, got {type(model).__name__}")
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path: expected a directory, got the existing file {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    cfg = _fit_cfg(pretrained_cfg if pretrained_cfg is not None else getattr(model, "pretrained_cfg", None), model)
    data = {"format": FORMAT, "architecture": "LaplacianFormer", "config": model.config,
            "pretrained_cfg": _jsonable_cfg(cfg)}
    tmp = directory / (CONFIG_NAME + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, directory / CONFIG_NAME)
    return directory / CONFIG_NAME


def save_pretrained(model: LaplacianFormer, path: str | os.PathLike, pretrained_cfg: Mapping | None = None) -> Path:
    """Write ``model``'s weights (``model.safetensors``) and ``config.json`` into the directory ``path``.

    ``pretrained_cfg`` as in ``write_config``. Returns the directory.
    """
    file = write_config(model, path, pretrained_cfg)
    text = file.read_text()
    save_weights(model.state_dict(), file.parent / WEIGHTS_NAME, metadata={"format": FORMAT, "config": text})
    return file.parent


# --- reading saved configs --------------------------------------------------------------------------------


def _parse_saved(text: str, where: Path) -> dict:
    """The saved-model config in ``text`` (``config.json``'s content): {"format", "config": constructor
    arguments, "pretrained_cfg": its lists back to timm's tuples}. ValueError naming ``where`` otherwise."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"path: {where} is not valid JSON ({e.msg})") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("config"), dict):
        got = data.get("format") if isinstance(data, dict) else None
        raise ValueError(f"path: {where} is not a {FORMAT} config (format={got!r}); "
                         + old_layout(f"a {CONFIG_NAME} holding a run's training settings"))
    cfg = data.get("pretrained_cfg") or {}
    cfg = {k: (tuple(v) if k in _TUPLE_KEYS and isinstance(v, list) else v) for k, v in cfg.items()}
    return dict(data, pretrained_cfg=cfg)


def _read_saved(path: str | os.PathLike) -> dict:
    """The saved-model config of the directory ``path`` (a save_pretrained or training run directory):
    its ``config.json`` as ``_parse_saved`` reads it. FileNotFoundError / ValueError starting ``path:``."""
    file = Path(path) / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"path: no {CONFIG_NAME} in {path} (expected a save_pretrained or training run directory)")
    return _parse_saved(file.read_text(), file)


def read_config(path: str | os.PathLike) -> dict:
    """The constructor arguments stored in ``config.json`` of the directory ``path``."""
    return _read_saved(path)["config"]


def weights_config(file: str | os.PathLike) -> dict | None:
    """The saved-model config that describes the weights file ``file`` (as ``_parse_saved`` reads it): the
    ``config`` entry of its safetensors metadata (``save_pretrained``), else the ``config.json`` beside it
    (a save_pretrained or training run directory); None when neither holds one (weights of another origin)."""
    path = Path(file)
    side = path.parent / CONFIG_NAME
    sources = [(path, read_metadata(path).get("config") if path.suffix == ".safetensors" and path.is_file() else None),
               (side, side.read_text() if side.is_file() else None)]
    for where, text in sources:
        if text:
            try:
                return _parse_saved(text, where)
            except ValueError:
                continue
    return None


set_weights_config_reader(weights_config)


# --- run directories --------------------------------------------------------------------------------------


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a training run directory (``train_config.json`` or ``checkpoint.safetensors``)."""
    p = Path(path)
    return p.is_dir() and any((p / name).is_file() for name in (TRAIN_CONFIG_NAME, CHECKPOINT_NAME))


def _refuse_old_checkpoint(path: Path) -> None:
    """CheckpointError naming ``path``'s ``checkpoint.pt`` (a run directory holding no newer checkpoint, or
    that file itself): the training checkpoint of laplacianformer before 0.1."""
    if path.is_dir() and not (path / CHECKPOINT_NAME).exists():
        path = path / _OLD_CHECKPOINT_NAME
    if path.name in (_OLD_CHECKPOINT_NAME, _OLD_CHECKPOINT_NAME + ".prev") and path.exists():
        raise CheckpointError(f"checkpoint: {path}: " + old_layout(f"a training checkpoint in {_OLD_CHECKPOINT_NAME}"))


def run_weights(path: str | os.PathLike) -> Path:
    """The weights ``from_pretrained`` loads from a training run directory: ``model_best.safetensors``
    (best test top-1 at an epoch end) if it exists, else the last weights: ``model.safetensors`` (end of
    the run), else the model in the training checkpoint ``checkpoint.safetensors`` (a run that has not
    finished)."""
    p = Path(path)
    for name in (BEST_WEIGHTS_NAME, WEIGHTS_NAME, CHECKPOINT_NAME):
        if (p / name).is_file():
            return p / name
    _refuse_old_checkpoint(p)
    raise FileNotFoundError(f"path: {p}: no {BEST_WEIGHTS_NAME}, {WEIGHTS_NAME} or {CHECKPOINT_NAME} in this run directory")


def read_run_checkpoint(path: str | os.PathLike, *, map_location="cpu") -> tuple[Path, dict]:
    """(file read, training state) of a classification run: the dict its ``Trainer.state_dict()`` held.

    ``path``: a run directory (its ``checkpoint.safetensors``) or a checkpoint file. When that file is
    damaged (truncated, hash mismatch, not a training checkpoint), its ``.prev`` is read instead, with a
    ``RuntimeWarning`` naming the problem.

    Raises:
        CheckpointError: ``checkpoint: <file>: <problem>`` for the file, with the ``.prev`` file's problem
            appended; ``checkpoint: <path>: no such file ...`` when there is neither; the ``old_layout``
            error for a ``checkpoint.pt``.
    """
    path = Path(path)
    _refuse_old_checkpoint(path)
    file = path / CHECKPOINT_NAME if path.is_dir() else path
    if not file.exists() and not previous_path(file).exists():
        raise CheckpointError(f"checkpoint: {file}: no such file (expected a run directory or a checkpoint file)")
    loaded = load_training_state(file, format=TRAIN_FORMAT, map_location=map_location, fallback_previous=True)
    return loaded.path, {**loaded.state, "format": loaded.metadata["format"], "model": loaded.model}


def _load_state(file: Path, map_location) -> dict:
    if file.name == CHECKPOINT_NAME:
        return read_run_checkpoint(file.parent, map_location=map_location)[1]["model"]
    return load_checkpoint(file, map_location=map_location)


def _pretrained_source(path: Path, ema: bool) -> tuple[dict, Path]:
    """(saved config, weights file) of ``from_pretrained``'s ``path``: a weights file (its config from its
    metadata or the config.json beside it), a run directory (``run_weights``, or ``model_ema.safetensors``
    with ``ema``) or a saved-model directory. FileNotFoundError / ValueError starting ``path:``."""
    if path.is_file():
        if ema:
            raise ValueError(f"path: {path} is a weights file; ema=True picks the EMA file of a run directory "
                             f"(pass the directory, or this file without ema)")
        data = weights_config(path)
        if data is None:
            raise FileNotFoundError(f"path: {path}: no saved config in its metadata and no {CONFIG_NAME} beside it "
                                    "(expected weights written by save_pretrained or a training run)")
        return data, path
    data = _read_saved(path)
    if not ema:
        return data, run_weights(path) if is_run_dir(path) else path / WEIGHTS_NAME
    if not (path / EMA_WEIGHTS_NAME).is_file():
        kind = "run directory (trained without --ema?)" if is_run_dir(path) else "saved-model directory"
        raise FileNotFoundError(f"path: no {EMA_WEIGHTS_NAME} in the {kind} {path}")
    return data, path / EMA_WEIGHTS_NAME


def from_pretrained(path: str | os.PathLike, *, ema: bool = False, map_location="cpu", **overrides) -> LaplacianFormer:
    """Rebuild and load a model from a saved-model directory, a training run directory or a weights file.

    Saved model (``save_pretrained``): ``config.json`` + ``model.safetensors``. Training run directory:
    its ``config.json`` and the weights chosen by ``run_weights``: the best weights if they exist, else
    the last. ``model.pretrained_cfg`` is the stored one: for a run, its input size (channels, image size),
    mean/std, interpolation and class names (``label_names``), so ``timm.data.resolve_data_config({},
    model=model)`` gives the run's preprocessing. ``ema=True``: a run's EMA weights (``model_ema.safetensors``,
    runs trained with ``--ema``). A weights file (e.g. ``run/model_ema.safetensors``) loads with the config
    of its metadata or of the ``config.json`` beside it.

    ``overrides`` replace stored constructor arguments (e.g. ``num_classes=10`` for fine-tuning, or
    ``attn="softmax"`` to load the weights into another attention variant): the state dict then goes
    through ``checkpoint_filter_fn``, and parameters without a counterpart keep their initialisation.
    Changing ``attn`` without giving ``attn_kwargs`` drops the stored ``attn_kwargs`` (they belong to the
    old variant).
    """
    data, file = _pretrained_source(Path(path), ema)
    config = dict(data["config"])
    if overrides.get("attn", config.get("attn")) != config.get("attn") and "attn_kwargs" not in overrides:
        config["attn_kwargs"] = {}
    config.update(overrides)
    model = LaplacianFormer(**config)
    state = _load_state(file, map_location)
    if overrides:
        state = checkpoint_filter_fn(state, model)
    model.load_state_dict(state, strict=True)
    model.pretrained_cfg = _fit_cfg(data["pretrained_cfg"], model)
    return model.to(map_location) if map_location is not None else model
