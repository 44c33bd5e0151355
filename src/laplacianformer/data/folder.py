"""ImageFolder-style directories read with PIL: ``root/<class>/<image>``.

Split layout: ``root/train/<class>/...`` and ``root/val/<class>/...`` (or ``test/``); a directory without
those subfolders is split by a seeded permutation (last ``test_fraction`` of each class to the test split).
For evaluation alone (``eval_samples``) a folder is scored whole: its ``val/`` (or ``test/``) split when it
has one, even without ``train/``, else every image of ``root/<class>/``.
Images are converted to grayscale (1 channel) or RGB (3 channels) and resized to a square ``img_size``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from .errors import DataError

IMAGE_EXTENSIONS = (".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm")


def scan_folder(root: Path) -> tuple[list[tuple[Path, int]], tuple[str, ...]]:
    """(path, label) pairs and the sorted class names of ``root/<class>/<image>``."""
    if not root.exists():
        raise DataError(f"{root}: data directory does not exist")
    if not root.is_dir():
        raise DataError(f"{root}: expected a directory of class folders")
    classes = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")))
    if not classes:
        raise DataError(f"{root}: no class folders found (expected {root}/<class>/<image>)")
    samples = []
    for label, name in enumerate(classes):
        for p in sorted((root / name).rglob("*")):
            if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS:
                samples.append((p, label))
    if not samples:
        raise DataError(f"{root}: no image files found in its class folders (extensions {', '.join(IMAGE_EXTENSIONS)})")
    return samples, classes


def _split_dir(root: Path) -> Path | None:
    """``root/val`` or ``root/test`` when it exists (the held-out split of a split layout)."""
    return next((root / n for n in ("val", "test") if (root / n).is_dir()), None)


def folder_splits(root: str | Path, test_fraction: float = 0.2, seed: int = 0):
    """Returns (train samples, test samples, classes) for an ImageFolder directory."""
    root = Path(root)
    train_dir = root / "train"
    test_dir = _split_dir(root)
    if test_dir is not None and not train_dir.is_dir():
        raise DataError(f"{root}: has {test_dir.name}/ but no train/ to train on (expected {root}/train/<class>/<image>)")
    if train_dir.is_dir() and test_dir is not None:
        train, classes = scan_folder(train_dir)
        test, test_classes = scan_folder(test_dir)
        if test_classes != classes:
            raise DataError(f"{test_dir}: class folders {list(test_classes)} differ from {train_dir}'s {list(classes)}")
        return train, test, classes
    samples, classes = scan_folder(root)
    rng = np.random.default_rng(seed)
    train, test = [], []
    for label in range(len(classes)):
        own = [s for s in samples if s[1] == label]
        order = rng.permutation(len(own))
        n_test = int(round(len(own) * test_fraction)) if len(own) > 1 else 0
        test += [own[i] for i in order[len(own) - n_test :]]
        train += [own[i] for i in order[: len(own) - n_test]]
    return train, test, classes


def eval_samples(root: str | Path, classes=None) -> tuple[list[tuple[Path, int]], tuple[str, ...]]:
    """Every image of a folder to evaluate on, as (path, label) pairs, and the class names the labels index.

    ``root/val/<class>`` (or ``test/``) when present, with or without ``train/``; else ``root/<class>``.
    ``classes``: the class names of the model (its label order); the folder's classes are matched to them by
    name and may be a subset (DataError naming a folder class the model does not have). None: the
    folder's sorted class names.
    """
    root = Path(root)
    samples, found = scan_folder(_split_dir(root) or root)
    if classes is None:
        return samples, found
    classes = tuple(str(c) for c in classes)
    unknown = [c for c in found if c not in classes]
    if unknown:
        raise DataError(f"{root}: class folders {unknown} are not classes of the model ({list(classes)})")
    index = [classes.index(c) for c in found]
    return [(p, index[label]) for p, label in samples], classes


def eight_bit(im):
    """A PIL image with 16-bit grey levels (mode I;16, or I above 255) scaled to 8 bits (mode L): PIL's
    ``convert`` would clip them at 255. Other modes are returned as they are."""
    from PIL import Image

    if not (im.mode.startswith("I;16") or im.mode == "I"):
        return im
    arr = np.asarray(im).astype(np.float64)
    if im.mode == "I" and arr.max(initial=0) <= 255:
        return Image.fromarray(arr.clip(0, 255).astype(np.uint8), "L")
    return Image.fromarray((arr / 257.0).round().clip(0, 255).astype(np.uint8), "L")


def decode_image(path: Path, in_chans: int, resize: Callable) -> torch.Tensor:
    """uint8 (in_chans, H, W) of an image file: 8-bit (``eight_bit``), grey or RGB, then ``resize`` (a PIL image
    to a PIL image of H×W); DataError naming the file when PIL cannot decode it."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im = resize(eight_bit(im).convert("L" if in_chans == 1 else "RGB"))
            arr = np.asarray(im, dtype=np.uint8)
    except Exception as e:  # PIL raises many types for corrupt files
        raise DataError(f"{path}: cannot read image ({type(e).__name__}: {e})") from None
    if arr.ndim == 2:
        arr = arr[:, :, None]
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).contiguous()


def read_image(path: Path, img_size: int, in_chans: int) -> torch.Tensor:
    """uint8 (in_chans, img_size, img_size): the whole image resized bilinearly; DataError naming the file when
    PIL cannot decode it."""
    from PIL import Image

    return decode_image(path, in_chans, lambda im: im.resize((img_size, img_size), Image.BILINEAR))


class FolderDataset(Dataset):
    """Decodes and resizes each image on access; items are (uint8 (C, S, S), int label)."""

    def __init__(self, samples, classes, img_size: int, in_chans: int = 3) -> None:
        self.samples = list(samples)
        self.classes = tuple(classes)
        self.img_size = img_size
        self.in_chans = in_chans
        self.labels = torch.tensor([s[1] for s in self.samples], dtype=torch.long)
        self.mean = (0.485, 0.456, 0.406) if in_chans == 3 else (0.5,)
        self.std = (0.229, 0.224, 0.225) if in_chans == 3 else (0.5,)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return read_image(path, self.img_size, self.in_chans), label

    def check_readable(self) -> None:
        """Decodes every image once, so a corrupt file is reported before training starts."""
        for path, _ in self.samples:
            read_image(path, 8, self.in_chans)
