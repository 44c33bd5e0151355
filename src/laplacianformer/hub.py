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

Weights files of other origins (``read_weights``): a timm ``train.py`` checkpoint (``model_best.pth.tar``,
``last.pth.tar``, ``checkpoint-N.pth.tar``: a ``torch.save`` dict with ``state_dict``, ``state_dict_ema``,
``arch``, ``args``) or a plain ``{name: tensor}`` state dict (``.pth``). They carry no integrity trailer, so
they load only with ``verify=False`` (``--no-verify``), still with ``weights_only=True``; ``arch`` names the
model, the weights give the class count and input channels, ``args`` the image size, ``model_kwargs`` and
preprocessing; a file that names no model needs ``model_name`` (``--model``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from .checkpoint import (
    CheckpointError, load_checkpoint, load_training_state, previous_path, read_metadata, save_weights,
)
from .models.laplacianformer import (
    LaplacianFormer, checkpoint_filter_fn, create_model, default_cfgs, set_weights_config_reader,
)
from .models.registry import list_models
from .layers.token_mixer import saved_attn_kwargs
from .ops.settings import SETTINGS_VERSION

__all__ = [
    "save_pretrained",
    "from_pretrained",
    "read_config",
    "weights_config",
    "write_config",
    "is_run_dir",
    "run_weights",
    "read_run_checkpoint",
    "read_weights",
    "WeightsFile",
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
            "pretrained_cfg": _jsonable_cfg(cfg), "settings_version": SETTINGS_VERSION}
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
    config = dict(data["config"])
    if isinstance(config.get("attn_kwargs"), dict):  # a file of an older version: the defaults of its time
        config["attn_kwargs"] = saved_attn_kwargs(config.get("attn", "laplacian"), config["attn_kwargs"],
                                                  data.get("settings_version", 1))
    return dict(data, config=config, pretrained_cfg=cfg)


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


# --- weights files of other origins: timm training checkpoints, plain state dicts --------------------------

_WRAPPERS = ("module.", "_orig_mod.")  # key prefixes of DDP and torch.compile wrappers (in either order)
_CFG_ARGS = ("mean", "std", "interpolation", "crop_pct")  # timm train.py args that are pretrained-cfg entries


class WeightsFile(NamedTuple):
    """A weights file as ``read_weights`` read it.

    ``state``: the model's ``{name: tensor}`` (wrapper prefixes removed). ``kind``: ``"timm"`` (a timm
    ``train.py`` checkpoint) or ``"state_dict"`` (a plain state dict, or safetensors weights).
    ``model``: the registered name the file records (a timm checkpoint's ``arch`` / ``args.model``), else
    None; ``arch``: that entry as written (also when it names no model of this family).
    ``kwargs``: constructor arguments the file fixes: ``num_classes`` (rows of ``head.weight``, else
    ``args.num_classes``), ``in_chans`` (the stem's input channels, else ``args.in_chans``) and, for a timm
    checkpoint, the entries of ``args.model_kwargs``. ``img_size``: ``args.img_size``, else
    ``args.input_size[1:]``, else None.
    ``pretrained_cfg``: ``args``' mean, std, interpolation and crop_pct where set.
    """

    state: dict
    path: Path
    kind: str
    model: str | None = None
    arch: str | None = None
    kwargs: dict = {}
    img_size: int | tuple[int, int] | None = None
    pretrained_cfg: dict = {}


def _tensor_dict(obj: Any, path: Path, what: str) -> dict:
    """``obj`` as a state dict with DDP / torch.compile prefixes removed; CheckpointError when it is not one."""
    if not isinstance(obj, Mapping) or not obj or not all(
            isinstance(k, str) and isinstance(v, torch.Tensor) for k, v in obj.items()):
        keys = sorted(map(str, obj))[:6] if isinstance(obj, Mapping) else type(obj).__name__
        raise CheckpointError(f"checkpoint: {path}: wrong format: {what} is not a state dict ({{name: tensor}}) "
                              f"nor a timm training checkpoint (a dict with 'state_dict'); found {keys}")
    state = {}
    for key, value in obj.items():
        name = key
        while name.startswith(_WRAPPERS):
            name = name[len(next(p for p in _WRAPPERS if name.startswith(p))):]
        if name in state:
            raise CheckpointError(f"checkpoint: {path}: {what} holds {name!r} twice (with and without a wrapper "
                                  "prefix)")
        state[name] = value
    return state


def _weights_kwargs(state: dict) -> dict:
    """The constructor arguments the weights themselves fix: ``num_classes`` (rows of ``head.weight``) and
    ``in_chans`` (input channels of the stem), where the state holds them."""
    head, stem = state.get("head.weight"), state.get("patch_embed.proj.weight")
    kwargs = {} if head is None or head.dim() != 2 else {"num_classes": int(head.shape[0])}
    return kwargs if stem is None or stem.dim() != 4 else dict(kwargs, in_chans=int(stem.shape[1]))


def _registered(arch: Any) -> str | None:
    """The registered name in a timm ``arch``/``--model`` entry (``timm/`` prefix and ``.tag`` dropped)."""
    if not isinstance(arch, str):
        return None
    name = arch.removeprefix("timm/").partition(".")[0]
    return name if name in list_models() else None


def _timm_args(args: Any, state: dict) -> tuple[dict, int | tuple[int, int] | None, dict]:
    """(constructor kwargs, image size, pretrained-cfg entries) of a timm checkpoint's ``args`` and weights."""
    a = vars(args) if isinstance(args, argparse.Namespace) else dict(args) if isinstance(args, Mapping) else {}
    extra = a.get("model_kwargs")
    kwargs = {str(k): v for k, v in extra.items()} if isinstance(extra, Mapping) else {}
    kwargs.update({k: a[k] for k in ("num_classes", "in_chans") if isinstance(a.get(k), int)})
    kwargs.update(_weights_kwargs(state))
    img = a.get("img_size")
    if not isinstance(img, int):
        size = a.get("input_size")
        img = (int(size[1]), int(size[2])) if isinstance(size, (list, tuple)) and len(size) == 3 else None
    cfg = {k: (tuple(a[k]) if isinstance(a[k], list) else a[k]) for k in _CFG_ARGS if a.get(k) is not None}
    return kwargs, img, cfg


def read_weights(path: str | os.PathLike, *, ema: bool = False, verify: bool = True, map_location="cpu") -> WeightsFile:
    """Read a weights file of any origin: safetensors weights, a plain ``torch.save`` state dict (``.pth``)
    or a timm ``train.py`` checkpoint (``model_best.pth.tar``, ...), never unpickling code.

    Args:
        path: the file.
        ema: take a timm checkpoint's ``state_dict_ema`` (CheckpointError when it has none; ValueError for a
            file holding one set of weights).
        verify: check the integrity trailer of a ``torch.save`` file (``checkpoint.load_checkpoint``): timm
            and plain ``torch.save`` files have none and load only with ``verify=False``, still with
            ``weights_only=True`` (``argparse.Namespace`` allowed for timm's ``args``).
        map_location: as for ``torch.load``.

    Returns:
        a ``WeightsFile``: the state dict without ``module.`` / ``_orig_mod.`` prefixes and what the file
        records of its model. CheckpointError (``checkpoint: <path>: ...``) for a file that is neither.
    """
    path = Path(path)
    _refuse_old_checkpoint(path)
    obj = load_checkpoint(path, map_location=map_location, verify=verify)
    if not isinstance(obj.get("state_dict"), Mapping):
        if ema:
            raise ValueError(f"ema: {path} holds one set of weights, not a timm checkpoint with state_dict_ema "
                             "(pass a run directory or a timm checkpoint, or this file without ema)")
        state = _tensor_dict(obj, path, "the file")
        return WeightsFile(state, path, "state_dict", kwargs=_weights_kwargs(state))
    key = "state_dict_ema" if ema else "state_dict"
    if obj.get(key) is None:
        raise CheckpointError(f"checkpoint: {path}: ema: this timm checkpoint holds no state_dict_ema "
                              "(trained without --model-ema)")
    state = _tensor_dict(obj[key], path, key)
    arch = obj.get("arch")
    args = obj.get("args")
    if not isinstance(arch, str) and isinstance(args, argparse.Namespace):
        arch = getattr(args, "model", None)
    kwargs, img, cfg = _timm_args(args, state)
    return WeightsFile(state, path, "timm", _registered(arch), arch if isinstance(arch, str) else None,
                       kwargs, img, cfg)


def _merge(config: dict, overrides: Mapping) -> dict:
    """``config`` with ``overrides``; changing ``attn`` without ``attn_kwargs`` drops the stored ones."""
    config = dict(config)
    if overrides.get("attn", config.get("attn")) != config.get("attn") and "attn_kwargs" not in overrides:
        config.pop("attn_kwargs", None)
    config.update(overrides)
    return config


def load_model_state(model: torch.nn.Module, state: dict, where: str) -> None:
    """``load_state_dict`` with a one-line CheckpointError when the weights belong to another architecture."""
    own = model.state_dict()
    missing = [k for k in own if k not in state]
    unexpected = [k for k in state if k not in own]
    shapes = [k for k in own if k in state and tuple(state[k].shape) != tuple(own[k].shape)]
    if missing or unexpected or shapes:
        detail = []
        if missing:
            detail.append(f"{len(missing)} missing keys (e.g. {missing[0]})")
        if unexpected:
            detail.append(f"{len(unexpected)} unexpected keys (e.g. {unexpected[0]})")
        if shapes:
            k = shapes[0]
            detail.append(f"{len(shapes)} shape mismatches (e.g. {k}: {tuple(state[k].shape)} vs {tuple(own[k].shape)})")
        raise CheckpointError(f"checkpoint: {where}: weights do not fit this model: {'; '.join(detail)}")
    model.load_state_dict(state)


def _load_into(model: LaplacianFormer, state: dict, file: Path, filtered: bool) -> LaplacianFormer:
    """``load_model_state`` (through ``checkpoint_filter_fn`` when ``filtered``)."""
    load_model_state(model, checkpoint_filter_fn(state, model) if filtered else state, str(file))
    return model


def _from_weights_file(path: Path, ema: bool, verify: bool, model_name: str | None, map_location,
                       overrides: dict) -> LaplacianFormer:
    """``from_pretrained`` of a weights file with no saved config: a timm checkpoint or a plain state dict."""
    wf = read_weights(path, ema=ema, verify=verify, map_location=map_location)
    name = model_name or wf.model
    if name is None:
        said = f" (its arch {wf.arch!r} is not one)" if wf.arch else ""
        raise FileNotFoundError(f"path: {path}: no saved config in its metadata, no {CONFIG_NAME} beside it and "
                                f"no timm arch naming a model of this family{said}: pass model_name= (one of "
                                f"{list_models()})")
    kwargs = dict(wf.kwargs)
    if wf.img_size is not None:
        kwargs.setdefault("img_size", wf.img_size)
    model = create_model(name, **_merge(kwargs, overrides))
    _load_into(model, wf.state, path, filtered=bool(overrides))
    model.pretrained_cfg = _fit_cfg(dict(model.pretrained_cfg, **wf.pretrained_cfg), model)
    return model.to(map_location) if map_location is not None else model


def _load_state(file: Path, map_location, verify: bool = True) -> dict:
    if file.name == CHECKPOINT_NAME:
        return read_run_checkpoint(file.parent, map_location=map_location)[1]["model"]
    return load_checkpoint(file, map_location=map_location, verify=verify)


def _pretrained_source(path: Path, ema: bool) -> tuple[dict, Path]:
    """(saved config, weights file) of ``from_pretrained``'s ``path``: a weights file (its config from its
    metadata or the config.json beside it), a run directory (``run_weights``, or ``model_ema.safetensors``
    with ``ema``) or a saved-model directory. FileNotFoundError / ValueError starting ``path:``."""
    if path.is_file():
        if ema:
            raise ValueError(f"path: {path} is a weights file; ema=True picks the EMA file of a run directory "
                             f"(pass the directory, or this file without ema)")
        return weights_config(path), path  # from_pretrained reads files without one with read_weights
    data = _read_saved(path)
    if not ema:
        return data, run_weights(path) if is_run_dir(path) else path / WEIGHTS_NAME
    if not (path / EMA_WEIGHTS_NAME).is_file():
        kind = "run directory (trained without --ema?)" if is_run_dir(path) else "saved-model directory"
        raise FileNotFoundError(f"path: no {EMA_WEIGHTS_NAME} in the {kind} {path}")
    return data, path / EMA_WEIGHTS_NAME


def from_pretrained(path: str | os.PathLike, *, ema: bool = False, verify: bool = True, model_name: str | None = None,
                    map_location="cpu", **overrides) -> LaplacianFormer:
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

    A weights file without a saved config (``read_weights``): a timm ``train.py`` checkpoint
    (``model_best.pth.tar``; ``ema=True`` takes its ``state_dict_ema``) or a plain state dict. Such files
    have no integrity trailer and load only with ``verify=False`` (still ``weights_only=True``: no code
    runs; a cut file fails to read, altered tensor bytes go unnoticed). The model is the one the file names
    (timm's ``arch``) or ``model_name`` (a registered name, e.g. ``"laplacianformer_tiny"``; required when the
    file names none), with the class count and input channels of the weights and timm's ``args``
    (``model_kwargs``, image size, mean/std) in ``pretrained_cfg``.
    """
    path = Path(path)
    if path.is_file() and weights_config(path) is None:
        return _from_weights_file(path, ema, verify, model_name, map_location, overrides)
    if model_name is not None:
        raise ValueError(f"model_name: {path} has a saved config, which names its model; pass constructor "
                         "overrides instead (model_name is for weights files without one)")
    data, file = _pretrained_source(path, ema)
    model = LaplacianFormer(**_merge(data["config"], overrides))
    _load_into(model, _load_state(file, map_location, verify), file, filtered=bool(overrides))
    model.pretrained_cfg = _fit_cfg(data["pretrained_cfg"], model)
    return model.to(map_location) if map_location is not None else model
