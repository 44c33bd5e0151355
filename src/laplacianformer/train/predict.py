"""Classify image files: ``predict(model_or_run, images, top_k=5)`` and ``laplacianformer predict``.

    from laplacianformer.train import predict
    for p in predict("runs/fm", ["shoe.png", "photos/"], top_k=3):
        p["path"], p["top_k"]          # [{"class": "sneaker", "index": 7, "prob": 0.91}, ...]

``model_or_run``: a training run directory (its best weights, ``hub.from_pretrained``), a saved model
directory (``save_pretrained``), a weights file (a timm ``train.py`` checkpoint or ``.pth`` state dict with
``verify=False``; ``model_name`` when it names no model) or a model with a timm ``pretrained_cfg``.
Preprocessing is the model's (``preprocess.Preprocessing.from_cfg(model.pretrained_cfg)``: a run's image
size, mean / std and whole-image bilinear resize; for timm checkpoints their cfg's crop and interpolation),
class names its ``label_names`` (else the class index). Folders give every image file under them, sorted.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch

from ..data import DataError
from ..data.folder import IMAGE_EXTENSIONS
from ..hub import from_pretrained
from .distributed import resolve_device
from .preprocess import Preprocessing
from .progress import ProgressLine, progress_mode


def image_paths(images) -> list[Path]:
    """The image files of ``images`` (a path or a list of paths): files as given, folders expanded to their
    image files (``data.folder.IMAGE_EXTENSIONS``, recursively, sorted). DataError naming a missing path or
    a folder without images."""
    items = [images] if isinstance(images, (str, Path)) else list(images)
    if not items:
        raise DataError("images: expected at least one image file or folder")
    out = []
    for item in map(Path, items):
        if item.is_dir():
            found = sorted(p for p in item.rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
            if not found:
                raise DataError(f"{item}: no image files in this folder (extensions {', '.join(IMAGE_EXTENSIONS)})")
            out += found
        elif item.is_file():
            out.append(item)
        else:
            raise DataError(f"{item}: no such image file or folder")
    return out


def load_predictor(model_or_run, *, ema: bool = False, verify: bool = True, model_name: str | None = None):
    """(model in eval mode, its ``Preprocessing``, class names) of a run / saved model / weights file /
    model (see the module docstring)."""
    if isinstance(model_or_run, torch.nn.Module):
        model = model_or_run
    else:
        path = Path(model_or_run)
        if not path.exists():
            raise FileNotFoundError(f"model_or_run: {path}: no such run directory, saved model or weights file")
        extra = {} if model_name is None else {"model_name": model_name}
        model = from_pretrained(path, ema=ema, verify=verify, **extra)
    cfg = getattr(model, "pretrained_cfg", None)
    if not cfg:
        raise ValueError(f"model_or_run: {type(model).__name__} has no pretrained_cfg (input_size, mean, std); "
                         "pass a run directory or saved model, or set model.pretrained_cfg")
    prep = Preprocessing.from_cfg(cfg)
    chans = getattr(model, "in_chans", prep.in_chans)
    if chans != prep.in_chans:
        raise ValueError(f"model_or_run: pretrained_cfg input_size has {prep.in_chans} channels, the model {chans}")
    names = cfg.get("label_names")
    classes = [str(c) for c in names] if names else None
    return model.eval(), prep, classes


@torch.no_grad()
def predict(model_or_run, images, *, top_k: int = 5, batch_size: int = 64, device: str | torch.device = "auto",
            ema: bool = False, verify: bool = True, model_name: str | None = None,
            progress: bool | str = False) -> list[dict]:
    """Top-``top_k`` classes of each image (``top_k`` is capped at the number of classes).

    Returns one dict per image, in order: ``{"path": str, "top_k": [{"class": name, "index": int,
    "prob": float}, ...]}`` (softmax probabilities, highest first). ``progress``: True -> a bar on a
    terminal, else a line at least every 30 s; ``"lines"``: lines. DataError naming the file for an image
    PIL cannot read.
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k: expected an integer >= 1, got {top_k!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size: expected an integer >= 1, got {batch_size!r}")
    paths = image_paths(images)
    model, prep, classes = load_predictor(model_or_run, ema=ema, verify=verify, model_name=model_name)
    dev = resolve_device(device) if isinstance(device, str) else torch.device(device)
    model.to(dev)
    mode = progress_mode(progress)
    bar = None
    if mode == "bars":
        from tqdm.auto import tqdm

        bar = tqdm(total=len(paths), desc="predict", unit="img", leave=False, dynamic_ncols=True)
    timed = ProgressLine("predict", len(paths), unit="image", enabled=mode == "lines")
    out = []
    for start in range(0, len(paths), batch_size):
        chunk = paths[start:start + batch_size]
        x = prep.normalize(torch.stack([prep.read(p) for p in chunk])).to(dev)
        probs = model(x).float().softmax(dim=1).cpu()
        if classes is not None and len(classes) != probs.shape[1]:
            raise ValueError(f"model_or_run: pretrained_cfg label_names has {len(classes)} names, the model "
                             f"{probs.shape[1]} classes")
        values, indices = probs.topk(min(top_k, probs.shape[1]), dim=1)
        for p, vs, ix in zip(chunk, values.tolist(), indices.tolist()):
            out.append({"path": str(p), "top_k": [
                {"class": classes[i] if classes else str(i), "index": i, "prob": v} for v, i in zip(vs, ix)]})
        if bar is not None:
            bar.update(len(chunk))
        timed.update(len(chunk), images=len(chunk))
    if bar is not None:
        bar.close()
    return out


def format_line(prediction: dict) -> str:
    """``path  class:prob  class:prob ...`` (probabilities with 3 decimals)."""
    return "  ".join([prediction["path"], *(f"{t['class']}:{t['prob']:.3f}" for t in prediction["top_k"])])


def write_json(predictions: list[dict], path: str | Path, **info) -> Path:
    """``{**info, "predictions": predictions}`` as JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({**info, "predictions": predictions}, indent=1) + "\n")
    return path


def write_csv(predictions: list[dict], path: str | Path) -> Path:
    """One row per image: ``path, class_1, prob_1, ..., class_k, prob_k``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    k = max((len(p["top_k"]) for p in predictions), default=0)
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", *(f"{what}_{i + 1}" for i in range(k) for what in ("class", "prob"))])
        for p in predictions:
            w.writerow([p["path"], *(v for t in p["top_k"] for v in (t["class"], f"{t['prob']:.6g}"))])
    return path
