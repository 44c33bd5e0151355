"""Saving and loading models, one layer above ``laplacianformer.models`` (which never imports this module).

    from laplacianformer import from_pretrained, save_pretrained
    save_pretrained(model, "runs/tiny")                # config.json + model.safetensors
    model = from_pretrained("runs/tiny")               # a saved model ...
    model = from_pretrained("runs/micro-laplacian")    # ... or a training run directory
    ft = from_pretrained("runs/tiny", num_classes=5)   # constructor overrides (new head, other variant)

Functions, not model methods (as ``timm.create_model``): the model classes stay free of file formats.

File names, one meaning each (in a saved-model directory and in a training run directory alike):

- ``config.json``: a saved model: ``{"format": "laplacianformer/1", "architecture": "LaplacianFormer",
  "config": <constructor arguments>, "pretrained_cfg": <timm pretrained cfg: input_size, mean, std,
  interpolation, crop_pct, num_classes, label_names, ...>}``.
- ``model.safetensors``: that model's weights (in a run directory: the weights at the end of the run).
- ``train_config.json``: the settings of a training run (``laplacianformer.train.TrainConfig``).
- ``checkpoint.safetensors`` (+ ``.prev``, the one before): the full training state of the run's latest
  checkpoint (``checkpoint.save_training_state``). Runs written before it kept that state in
  ``checkpoint.pt`` (``LEGACY_CHECKPOINT_NAME``, a ``save_checkpoint`` file); ``read_run_checkpoint`` reads
  either.
- ``model_best.safetensors``: the run's weights with the best test top-1 at an epoch end (the weights that
  were evaluated: the EMA weights with ``--ema``). ``model_ema.safetensors``: the EMA weights at the end.

Runs written before ``train_config.json`` existed kept the training settings in ``config.json``;
``is_train_config`` recognises that content, and the training package still resumes and evaluates them.

Weights are written atomically with an integrity hash (``checkpoint.save_weights``) and read with
``checkpoint.load_checkpoint``, which reads safetensors and never unpickles code (a legacy ``checkpoint.pt``
is loaded with ``weights_only=True`` after its integrity check).
"""

from __future__ import annotations

import json
import os
import warnings
from collections.abc import Mapping
from pathlib import Path

from .checkpoint import CheckpointError, load_checkpoint, load_training_state, previous_path, save_weights
from .models.laplacianformer import LaplacianFormer, checkpoint_filter_fn, default_cfgs
from .models.registry import list_models

__all__ = [
    "save_pretrained",
    "from_pretrained",
    "read_config",
    "write_config",
    "is_train_config",
    "is_run_dir",
    "run_weights",
    "read_run_checkpoint",
    "CONFIG_NAME",
    "WEIGHTS_NAME",
    "TRAIN_CONFIG_NAME",
    "CHECKPOINT_NAME",
    "LEGACY_CHECKPOINT_NAME",
    "BEST_WEIGHTS_NAME",
    "EMA_WEIGHTS_NAME",
]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
TRAIN_CONFIG_NAME = "train_config.json"
CHECKPOINT_NAME = "checkpoint.safetensors"
LEGACY_CHECKPOINT_NAME = "checkpoint.pt"  # training checkpoints before CHECKPOINT_NAME: torch.save + trailer
BEST_WEIGHTS_NAME = "model_best.safetensors"
EMA_WEIGHTS_NAME = "model_ema.safetensors"
FORMAT = "laplacianformer/1"
TRAIN_FORMAT = "laplacianformer.train/1"  # the ``format`` of a classification training checkpoint
_TUPLE_KEYS = ("input_size", "pool_size", "mean", "std", "label_names", "test_input_size", "min_input_size")


def _jsonable_cfg(cfg: Mapping) -> dict:
    return {k: (list(v) if isinstance(v, tuple) else v) for k, v in cfg.items() if _is_json(v)}


def _is_json(v) -> bool:
    try:
        json.dumps(v)
    except (TypeError, ValueError):
        return False
    return True


def _cfg_from_json(cfg: Mapping) -> dict:
    return {k: (tuple(v) if k in _TUPLE_KEYS and isinstance(v, list) else v) for k, v in cfg.items()}


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


def is_train_config(data) -> bool:
    """True for the content of a training configuration (``TrainConfig.to_dict()``), as old run
    directories stored it in ``config.json``: a dict with the run fields and no saved-model ``format``."""
    return isinstance(data, dict) and "format" not in data and {"model", "attn", "data", "img_size"} <= set(data)


def _read_json(file: Path):
    try:
        return json.loads(file.read_text())
    except json.JSONDecodeError as e:
        raise ValueError(f"path: {file} is not valid JSON ({e.msg})") from None


def is_run_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a training run directory (``train_config.json``, a training checkpoint
    (``checkpoint.safetensors`` or a legacy ``checkpoint.pt``) or an old ``config.json`` holding a training
    configuration)."""
    p = Path(path)
    if not p.is_dir():
        return False
    if any((p / name).is_file() for name in (TRAIN_CONFIG_NAME, CHECKPOINT_NAME, LEGACY_CHECKPOINT_NAME)):
        return True
    return (p / CONFIG_NAME).is_file() and is_train_config(_read_json(p / CONFIG_NAME))


def _read_saved(path: str | os.PathLike) -> dict:
    directory = Path(path)
    file = directory / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"path: no {CONFIG_NAME} in {path} (expected a save_pretrained or training run directory)")
    data = _read_json(file)
    if is_train_config(data):
        raise ValueError(
            f"path: {file} holds the training settings of a run written before saved-model configs; "
            "resume the run once, or call laplacianformer.train.upgrade_run on it, to write its model config"
        )
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("config"), dict):
        raise ValueError(f"path: {file} is not a {FORMAT} config (format={data.get('format') if isinstance(data, dict) else None!r})")
    return data


def read_config(path: str | os.PathLike) -> dict:
    """The constructor arguments stored in ``config.json`` of the directory ``path``."""
    return _read_saved(path)["config"]


def run_weights(path: str | os.PathLike) -> Path:
    """The weights ``from_pretrained`` loads from a training run directory: ``model_best.safetensors``
    (best test top-1 at an epoch end) if it exists, else the last weights: ``model.safetensors`` (end of
    the run), else the model in the training checkpoint (a run that has not finished):
    ``checkpoint.safetensors``, or in a run written before it, ``checkpoint.pt``."""
    p = Path(path)
    for name in (BEST_WEIGHTS_NAME, WEIGHTS_NAME, CHECKPOINT_NAME, LEGACY_CHECKPOINT_NAME):
        if (p / name).is_file():
            return p / name
    raise FileNotFoundError(f"path: {p}: no {BEST_WEIGHTS_NAME}, {WEIGHTS_NAME}, {CHECKPOINT_NAME} or "
                            f"{LEGACY_CHECKPOINT_NAME} in this run directory")


def _checkpoint_candidates(path: Path) -> list[Path]:
    """The files ``read_run_checkpoint`` tries, newest first."""
    if not path.is_dir():
        return [path, previous_path(path)]
    files = []
    for name in (CHECKPOINT_NAME, LEGACY_CHECKPOINT_NAME):
        files += [path / name, previous_path(path / name)]
    return files


def read_run_checkpoint(path: str | os.PathLike, *, map_location="cpu") -> tuple[Path, dict]:
    """(file read, training state) of a classification run: the dict its ``Trainer.state_dict()`` held.

    ``path``: a run directory or a checkpoint file. A directory's checkpoint is ``checkpoint.safetensors``,
    else ``checkpoint.pt`` (runs written before the safetensors checkpoint); a file is read as it is. When
    the latest file is damaged (truncated, hash mismatch, not a training checkpoint), the previous one is
    read instead, with a ``RuntimeWarning`` naming the problem: ``<name>.prev``, then (a directory) the
    legacy ``checkpoint.pt`` and its ``.prev``, which a run resumed once after the change still holds.

    Raises:
        CheckpointError: ``checkpoint: <file>: <problem>`` for the newest existing file, with the other
            files' problems appended; ``checkpoint: <path>: no such file ...`` when there is none.
    """
    path = Path(path)
    files = [f for f in _checkpoint_candidates(path) if f.exists()]
    if not files:
        where = path / CHECKPOINT_NAME if path.is_dir() else path
        raise CheckpointError(f"checkpoint: {where}: no such file (expected a run directory or a checkpoint file"
                              f"{f', or {LEGACY_CHECKPOINT_NAME} in a run written before {CHECKPOINT_NAME}' if path.is_dir() else ''})")
    errors: list[CheckpointError] = []
    for file in files:
        try:
            model, state, meta, _ = load_training_state(file, format=TRAIN_FORMAT, map_location=map_location)
        except CheckpointError as exc:
            errors.append(exc)
            continue
        if errors:
            warnings.warn(f"{'; '.join(map(str, errors))}; loaded the previous checkpoint {file} instead",
                          RuntimeWarning, stacklevel=2)
        return file, {**state, "format": meta["format"], "model": model}
    raise CheckpointError("; no fallback: ".join(map(str, errors)))


def _load_state(file: Path, map_location) -> dict:
    if file.name in (CHECKPOINT_NAME, LEGACY_CHECKPOINT_NAME):
        return read_run_checkpoint(file.parent, map_location=map_location)[1]["model"]
    return load_checkpoint(file, map_location=map_location)


def from_pretrained(path: str | os.PathLike, *, map_location="cpu", **overrides) -> LaplacianFormer:
    """Rebuild and load a model from a saved-model directory or a training run directory.

    Saved model (``save_pretrained``): ``config.json`` + ``model.safetensors``. Training run directory:
    its ``config.json`` and the weights chosen by ``run_weights``: the best weights if they exist, else
    the last. ``model.pretrained_cfg`` is the stored one: for a run, its input size (channels, image size),
    mean/std, interpolation and class names (``label_names``), so ``timm.data.resolve_data_config({},
    model=model)`` gives the run's preprocessing.

    ``overrides`` replace stored constructor arguments (e.g. ``num_classes=10`` for fine-tuning, or
    ``attn="softmax"`` to load the weights into another attention variant): the state dict then goes
    through ``checkpoint_filter_fn``, and parameters without a counterpart keep their initialisation.
    Changing ``attn`` without giving ``attn_kwargs`` drops the stored ``attn_kwargs`` (they belong to the
    old variant).
    """
    directory = Path(path)
    data = _read_saved(directory)
    config = dict(data["config"])
    if overrides.get("attn", config.get("attn")) != config.get("attn") and "attn_kwargs" not in overrides:
        config["attn_kwargs"] = {}
    config.update(overrides)
    model = LaplacianFormer(**config)
    file = run_weights(directory) if is_run_dir(directory) else directory / WEIGHTS_NAME
    state = _load_state(file, map_location)
    if overrides:
        state = checkpoint_filter_fn(state, model)
    model.load_state_dict(state, strict=True)
    model.pretrained_cfg = _fit_cfg(_cfg_from_json(data.get("pretrained_cfg") or {}), model)
    return model.to(map_location) if map_location is not None else model
