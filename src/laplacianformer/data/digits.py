"""scikit-learn's digits (1,797 real 8x8 grayscale images, 10 classes): a tiny data set for fast tests.

There is no official split; ours is a fixed seeded permutation with the last 20% as the test split.
"""

from __future__ import annotations

import numpy as np

from .errors import DataError

CLASSES = tuple(str(i) for i in range(10))


def load_digits_split(split: str = "train", test_fraction: float = 0.2) -> tuple[np.ndarray, np.ndarray]:
    """Returns (images uint8 (N, 8, 8) scaled from 0..16 to 0..255, labels int64 (N,))."""
    if split not in ("train", "test"):
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        raise DataError("digits: needs scikit-learn (pip install scikit-learn)") from None
    d = load_digits()
    images = np.clip(np.rint(d.images * (255.0 / 16.0)), 0, 255).astype(np.uint8)
    labels = d.target.astype(np.int64)
    order = np.random.default_rng(0).permutation(len(labels))
    n_test = int(round(len(labels) * test_fraction))
    idx = order[-n_test:] if split == "test" else order[:-n_test]
    return images[idx], labels[idx]
