"""Evaluate a saved run: ``evaluate_checkpoint(run_dir_or_file)`` -> metrics, ``eval.json``, ``confusion.png``.

Without ``data`` the run's own test split is scored (its data path resolved from any working directory:
``config.resolve_data``); with ``data`` = an image folder, every image of that folder is scored
(``data.build_eval_dataset``: its ``val/``/``test/`` split when it has one), its class folders matched by
name to the classes the model was trained on.
"""

from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import CheckpointError, load_checkpoint, read_metadata
from ..data import BUILTIN, build_datasets, build_eval_dataset
from ..hub import CHECKPOINT_NAME, EMA_WEIGHTS_NAME, WEIGHTS_NAME, read_run_checkpoint, weights_config
from .config import TrainConfig, read_train_config, resolve_data
from .engine import build_model, load_model_state, resolve_device
from .evaluate import evaluate
from .plots import plot_confusion


def _is_training_checkpoint(file: Path) -> bool:
    """A training checkpoint (``checkpoint.safetensors``, its ``.prev``, or any file that is not plain
    safetensors weights) rather than a weights file."""
    if file.name.endswith(".prev") or file.name == CHECKPOINT_NAME:
        return True
    return file.suffix != ".safetensors" or "state" in read_metadata(file)


def load_for_eval(path: str | Path, *, ema: bool = False) -> tuple[TrainConfig, dict, Path]:
    """(config, model state dict, file read) from a run directory, a training checkpoint
    (``checkpoint.safetensors``) or a ``.safetensors`` weights file.

    A run directory gives ``model.safetensors`` (``model_ema.safetensors`` with ``ema``), else its training
    checkpoint (``hub.read_run_checkpoint``: the previous file when the latest is damaged). A weights file's
    training config is its metadata's, else the ``train_config.json`` beside it."""
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
        return TrainConfig.from_dict(obj["config"]), state, file
    obj = load_checkpoint(p)
    saved = read_metadata(p).get("train_config")
    config = TrainConfig.from_dict(json.loads(saved)) if saved else read_train_config(p.parent)
    return config, obj, p


def run_classes(file: Path) -> list[str] | None:
    """The class names (label order) of the weights in ``file``: its safetensors metadata, the training
    checkpoint, or the ``label_names`` of its saved-model config (``hub.weights_config``); None when none
    records them."""
    file = Path(file)
    if _is_training_checkpoint(file):
        names = read_run_checkpoint(file)[1].get("classes")
    else:
        names = json.loads(read_metadata(file).get("classes") or "null")
    if not names:
        names = ((weights_config(file) or {}).get("pretrained_cfg") or {}).get("label_names")
    return [str(c) for c in names] if names else None


def _head_rows(state: dict) -> int | None:
    head = state.get("head.weight")
    return None if head is None else int(head.shape[0])


def evaluate_checkpoint(path, *, data: str | None = None, model: str | None = None, test_subset: int | None = None,
                        batch_size: int = 256, amp: str = "off", ema: bool = False, out: str | Path | None = None,
                        device: str = "auto", progress: bool = True) -> dict:
    """Evaluates a saved model on the test split of its own data set, or on ``data``.

    ``data``: a built-in set (its test split) or an image folder, of which EVERY image is scored (its
    ``val/`` or ``test/`` split when it has one, else all ``<class>/`` folders); the folder's classes are
    matched by name to the model's (a subset is fine; DataError for a class the model lacks).
    Returns the ``evaluate`` dict plus ``classes`` (the model's), ``data``, ``json`` and ``confusion_png``
    (paths written).
    """
    config, state, file = load_for_eval(path, ema=ema)
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

