"""Evaluate a saved run: ``evaluate_checkpoint(run_dir_or_file)`` -> metrics, ``eval.json``, ``confusion.png``."""

from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import CheckpointError, load_checkpoint, read_metadata
from ..data import build_datasets
from ..hub import CHECKPOINT_NAME, EMA_WEIGHTS_NAME, TRAIN_CONFIG_NAME, WEIGHTS_NAME, is_train_config, write_config
from .config import TrainConfig, read_train_config
from .engine import build_model, load_model_state, resolve_device, run_pretrained_cfg
from .evaluate import evaluate
from .plots import plot_confusion
from .state import FORMAT


def load_for_eval(path: str | Path, *, ema: bool = False) -> tuple[TrainConfig, dict, Path]:
    """(config, model state dict, file read) from a run directory, checkpoint.pt or .safetensors file."""
    p = Path(path)
    if p.is_dir():
        if ema:
            candidates = [p / EMA_WEIGHTS_NAME]
        else:
            candidates = [p / WEIGHTS_NAME, p / CHECKPOINT_NAME]
        found = next((c for c in candidates if c.exists()), None)
        if found is None:
            raise CheckpointError(f"checkpoint: {p}: no {' or '.join(c.name for c in candidates)} in this directory")
        p = found
    elif not p.exists():
        raise CheckpointError(f"checkpoint: {p}: no such file or directory")
    obj = load_checkpoint(p)
    if p.suffix == ".safetensors":
        meta = read_metadata(p)
        # "train_config"; runs written before it used "config" (recognised by content)
        saved = json.loads(meta.get("train_config") or meta.get("config") or "null")
        if is_train_config(saved):
            config = TrainConfig.from_dict(saved)
        else:
            try:
                config = read_train_config(p.parent)
            except CheckpointError:
                raise CheckpointError(f"checkpoint: {p}: no training config in its metadata or next to it") from None
        return config, obj, p
    if obj.get("format") != FORMAT or "model" not in obj:
        raise CheckpointError(f"checkpoint: {p}: not a laplacianformer training checkpoint")
    state = obj["model"]
    if ema:
        if not obj.get("ema"):
            raise CheckpointError(f"checkpoint: {p}: the run kept no EMA weights (trained without --ema)")
        state = obj["ema"]["shadow"]
    return TrainConfig.from_dict(obj["config"]), state, p


def evaluate_checkpoint(path, *, data: str | None = None, model: str | None = None, test_subset: int | None = None,
                        batch_size: int = 256, amp: str = "off", ema: bool = False, out: str | Path | None = None,
                        device: str = "auto", progress: bool = True) -> dict:
    """Evaluates a saved model on the test split of its data set (or ``data``).

    Returns the ``evaluate`` dict plus ``classes``, ``json`` and ``confusion_png`` (paths written).
    """
    config, state, file = load_for_eval(path, ema=ema)
    if model is not None:
        config.model = model
    if data is not None:
        config.data = data
    config.test_subset = test_subset
    splits = build_datasets(config.data, config.img_size, in_chans=config.in_chans, train_subset=1,
                            test_subset=test_subset, seed=config.seed, check_images=config.verify_images)
    net = build_model(config, len(splits.classes), splits.in_chans)
    load_model_state(net, state, str(file))
    dev = resolve_device(device)
    res = evaluate(net.to(dev), splits.test, batch_size=batch_size, device=dev, amp=amp,
                   num_classes=len(splits.classes), progress=progress)
    out_dir = Path(out) if out else file.parent
    out_dir.mkdir(parents=True, exist_ok=True)
    res["classes"] = [str(c) for c in splits.classes]
    res["checkpoint"] = str(file)
    res["data"] = config.data
    res["json"] = str(out_dir / "eval.json")
    res["confusion_png"] = str(out_dir / "confusion.png")
    plot_confusion(res["confusion"], res["classes"], res["confusion_png"],
                   title=f"{config.model} ({config.attn}) on {config.data}: top-1 {100 * res['top1']:.1f}%")
    Path(res["json"]).write_text(json.dumps(res, indent=1) + "\n")
    return res


def upgrade_run(run_dir: str | Path) -> Path:
    """Give a run directory written before ``train_config.json`` the current layout: its ``config.json``
    (the training settings) becomes ``train_config.json``, and ``config.json`` is written as the saved
    model's config (architecture and preprocessing), so ``laplacianformer.from_pretrained(run_dir)``
    loads it. Reads the data set for the class names and mean/std. Returns the directory."""
    d = Path(run_dir)
    config = read_train_config(d)
    splits = build_datasets(config.data, config.img_size, in_chans=config.in_chans, train_subset=1, test_subset=1,
                            seed=config.seed, check_images=False)
    model = build_model(config, len(splits.classes), splits.in_chans)
    config.save(d / TRAIN_CONFIG_NAME)
    write_config(model, d, run_pretrained_cfg(model, config, splits))
    return d
