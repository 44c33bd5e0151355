"""Fashion-MNIST (Zalando, MIT licence): 60k train / 10k test 28x28 grayscale images, 10 classes.

Looked up, in order, in: an explicit directory, ``$LAPLACIANFORMER_DATA`` (the directory itself or its
``fashion-mnist`` subfolder), ``~/.cache/laplacianformer/fashion-mnist``, ``/usr/share/datasets/fashion-mnist``
(Debian package ``dataset-fashion-mnist``). Nothing is downloaded.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .errors import DataError
from .idx import read_idx

CLASSES = ("t-shirt/top", "trouser", "pullover", "dress", "coat", "sandal", "shirt", "sneaker", "bag", "ankle boot")
SYSTEM_DIR = Path("/usr/share/datasets/fashion-mnist")
_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
INSTALL_HINT = "apt-get install dataset-fashion-mnist"


def candidate_dirs(root: str | Path | None = None) -> list[Path]:
    """Directories searched for the four IDX files, most specific first."""
    dirs = []
    if root is not None:
        dirs += [Path(root), Path(root) / "fashion-mnist"]
    env = os.environ.get("LAPLACIANFORMER_DATA")
    if env:
        dirs += [Path(env), Path(env) / "fashion-mnist"]
    dirs += [Path.home() / ".cache" / "laplacianformer" / "fashion-mnist", SYSTEM_DIR]
    return dirs


def _find(directory: Path, stem: str) -> Path | None:
    for name in (stem + ".gz", stem):
        if (directory / name).is_file():
            return directory / name
    return None


def find_fashion_mnist(root: str | Path | None = None) -> Path:
    """The first directory holding all four Fashion-MNIST files; DataError naming the install command if none."""
    for d in candidate_dirs(root):
        if all(_find(d, stem) for pair in _FILES.values() for stem in pair):
            return d
    searched = ", ".join(str(d) for d in candidate_dirs(root))
    raise DataError(
        f"fashion-mnist: data set not found (searched {searched}); install it with `{INSTALL_HINT}` "
        "or set LAPLACIANFORMER_DATA to a directory holding the four *-ubyte.gz files"
    )


def load_fashion_mnist(split: str = "train", root: str | Path | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Returns (images uint8 (N, 28, 28), labels int64 (N,)) of the 'train' or 'test' split."""
    if split not in _FILES:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    d = find_fashion_mnist(root)
    img_stem, lbl_stem = _FILES[split]
    images = read_idx(_find(d, img_stem))
    labels = read_idx(_find(d, lbl_stem)).astype(np.int64)
    if images.ndim != 3 or labels.ndim != 1 or len(images) != len(labels):
        raise DataError(f"{d}: Fashion-MNIST {split} images {images.shape} and labels {labels.shape} do not match")
    return images, labels
