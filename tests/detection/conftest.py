"""Fixtures of the detection tests: a tiny FashionScenes set (128 px) and a helper to write COCO files.

The scenes use the installed Fashion-MNIST when it is found, else a few generated 28x28 items (bright
blocks), so the tests run on any machine. Everything runs on 1 thread (shared CI cores).
"""

from __future__ import annotations

import gzip
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from laplacianformer.data import DataError
from laplacianformer.data.fashion_mnist import find_fashion_mnist
from laplacianformer.data.scenes import make_scenes

TRAIN, VAL, SIZE = 6, 2, 128


def _idx(path: Path, arr: np.ndarray) -> None:
    with gzip.open(path, "wb") as f:
        f.write(bytes([0, 0, 8, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes())


def _fashion_root(tmp: Path) -> Path | None:
    try:
        find_fashion_mnist()
        return None
    except DataError:
        rng = np.random.default_rng(0)
        for stem, n in (("train", 40), ("t10k", 20)):
            items = np.zeros((n, 28, 28), np.uint8)
            for i in range(n):
                y0, x0 = rng.integers(2, 10, size=2)
                items[i, y0:y0 + 16, x0:x0 + 14] = rng.integers(120, 256)
            _idx(tmp / f"{stem}-images-idx3-ubyte.gz", items)
            _idx(tmp / f"{stem}-labels-idx1-ubyte.gz", np.arange(n) % 10)
        return tmp


@pytest.fixture(scope="session")
def scenes(tmp_path_factory) -> Path:
    """DIR with train (6 scenes) and val (2 scenes) at 128 px, COCO layout."""
    out = tmp_path_factory.mktemp("scenes") / "fs"
    root = _fashion_root(tmp_path_factory.mktemp("fashion"))
    make_scenes(out, size=SIZE, train=TRAIN, val=VAL, seed=0, max_items=4, max_scale=2.5, progress=False,
                data_root=root)
    return out


@pytest.fixture(autouse=True)
def _one_thread():
    prev = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(prev)


@pytest.fixture
def write_coco():
    """The ``_write_coco`` helper."""
    return _write_coco


def _write_coco(tmp: Path, data: dict, images: dict[str, tuple[int, int]] | None = None) -> tuple[Path, Path]:
    """Write ``data`` as DIR/annotations/instances_val.json and blank PNGs ``{file_name: (w, h)}``; (ann, DIR)."""
    from PIL import Image

    (tmp / "annotations").mkdir(parents=True, exist_ok=True)
    (tmp / "val").mkdir(exist_ok=True)
    for name, (w, h) in (images or {}).items():
        Image.new("L", (w, h), 40).save(tmp / "val" / name)
    ann = tmp / "annotations" / "instances_val.json"
    ann.write_text(json.dumps(data))
    return ann, tmp
