"""Save and load LaplacianFormer models as a directory: ``model.safetensors`` + ``config.json``.

    model.save_pretrained("runs/tiny")                      # or hub.save_pretrained(model, "runs/tiny")
    model = LaplacianFormer.from_pretrained("runs/tiny")     # or hub.from_pretrained("runs/tiny")

The weights are written atomically with an integrity hash (``checkpoint.save_weights``) and read with
``checkpoint.load_checkpoint``, which reads safetensors and never unpickles anything. ``config.json``
holds the constructor arguments, so no code is needed to rebuild the architecture.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from .checkpoint import load_checkpoint, save_weights
from .models.laplacianformer import LaplacianFormer, checkpoint_filter_fn

__all__ = ["save_pretrained", "from_pretrained", "CONFIG_NAME", "WEIGHTS_NAME"]

CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"
FORMAT = "laplacianformer/1"


def save_pretrained(model: LaplacianFormer, path: str | os.PathLike) -> Path:
    """Write ``model``'s weights and constructor config into the directory ``path`` (created if needed)."""
    if not isinstance(model, LaplacianFormer):
        raise TypeError(f"model: expected a LaplacianFormer, got {type(model).__name__}")
    directory = Path(path)
    if directory.exists() and not directory.is_dir():
        raise ValueError(f"path: expected a directory, got the existing file {directory}")
    directory.mkdir(parents=True, exist_ok=True)
    config = {"format": FORMAT, "architecture": "LaplacianFormer", "config": model.config}
    text = json.dumps(config, indent=2, sort_keys=True)
    save_weights(model.state_dict(), directory / WEIGHTS_NAME, metadata={"format": FORMAT, "config": text})
    tmp = directory / (CONFIG_NAME + ".tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, directory / CONFIG_NAME)
    return directory


def read_config(path: str | os.PathLike) -> dict:
    """The constructor arguments stored by ``save_pretrained`` in the directory ``path``."""
    file = Path(path) / CONFIG_NAME
    if not file.is_file():
        raise FileNotFoundError(f"path: no {CONFIG_NAME} in {path} (expected a save_pretrained directory)")
    data = json.loads(file.read_text())
    if not isinstance(data, dict) or data.get("format") != FORMAT or not isinstance(data.get("config"), dict):
        raise ValueError(f"path: {file} is not a {FORMAT} config (format={data.get('format') if isinstance(data, dict) else None!r})")
    return data["config"]


def from_pretrained(path: str | os.PathLike, *, map_location="cpu", **overrides) -> LaplacianFormer:
    """Rebuild and load a model written by ``save_pretrained``.

    ``overrides`` replace stored constructor arguments (e.g. ``num_classes=10`` for fine-tuning, or
    ``attn="softmax"`` to load the weights into another attention variant): the state dict then goes
    through ``checkpoint_filter_fn``, and parameters without a counterpart keep their initialisation.
    Changing ``attn`` without giving ``attn_kwargs`` drops the stored ``attn_kwargs`` (they belong to the
    old variant).
    """
    config = read_config(path)
    if overrides.get("attn", config.get("attn")) != config.get("attn") and "attn_kwargs" not in overrides:
        config["attn_kwargs"] = {}
    config.update(overrides)
    model = LaplacianFormer(**config)
    state = load_checkpoint(Path(path) / WEIGHTS_NAME, map_location=map_location)
    if overrides:
        state = checkpoint_filter_fn(state, model)
    model.load_state_dict(state, strict=True)
    return model.to(map_location) if map_location is not None else model
