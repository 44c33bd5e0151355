"""Data sources for training and evaluation: Fashion-MNIST (embedded default), sklearn digits, ImageFolder.

``build_datasets(name_or_path, img_size, ...)`` returns train/test datasets whose items are uint8 image
tensors (C, img_size, img_size) and int labels; augmentation and normalisation happen on whole batches
in ``laplacianformer.train.augment`` so that they are seeded and resumable.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch.utils.data import Dataset

from . import digits, fashion_mnist
from .errors import DataError
from .fashion_mnist import find_fashion_mnist, load_fashion_mnist
from .folder import FolderDataset, eval_samples, folder_splits
from .idx import read_idx

BUILTIN = ("fashion-mnist", "digits")


class TensorImageDataset(Dataset):
    """An in-memory data set: images uint8 (N, C, S, S), labels int64 (N,)."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, classes, mean, std) -> None:
        self.images = images
        self.labels = labels
        self.classes = tuple(classes)
        self.mean = tuple(mean)
        self.std = tuple(std)
        self.in_chans = images.shape[1]

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int):
        return self.images[i], int(self.labels[i])

    def batch(self, idx: torch.Tensor):
        """Gathers a batch without a DataLoader: (uint8 (B, C, S, S), int64 (B,))."""
        return self.images[idx], self.labels[idx]


@dataclass
class DataSplits:
    train: Dataset
    test: Dataset
    classes: tuple
    in_chans: int


def resize_uint8(images: np.ndarray, img_size: int) -> torch.Tensor:
    """(N, H, W) uint8 -> (N, 1, S, S) uint8, bilinear (upsampling for the 28/8-px sets)."""
    x = torch.from_numpy(np.require(images, requirements=("C", "W"))).unsqueeze(1)  # read-only buffers: copied
    if x.shape[-1] == img_size and x.shape[-2] == img_size:
        return x.clone()
    out = []
    for chunk in x.split(4096):
        y = F.interpolate(chunk.float(), size=(img_size, img_size), mode="bilinear", align_corners=False)
        out.append(y.round_().clamp_(0, 255).to(torch.uint8))
    return torch.cat(out)


def _subset(images, labels, n: int | None, seed: int):
    """A seeded random subset of n items (stratification not needed at these sizes); None keeps all."""
    if n is None or n >= len(labels):
        return images, labels
    idx = np.sort(np.random.default_rng(seed).permutation(len(labels))[:n])
    return images[idx], labels[idx]


def holdout_indices(n: int, holdout: int, seed: int) -> np.ndarray:
    """The sorted indices of the ``holdout`` of ``n`` training items held out as a validation split: a
    permutation seeded by ``seed`` alone (the same split for every run seed). ValueError when too large."""
    if not 0 < holdout < n:
        raise DataError(f"holdout: expected between 1 and {n - 1} (the training set has {n} items), got {holdout}")
    return np.sort(np.random.default_rng(seed).permutation(n)[:holdout])


def split_holdout(images, labels, holdout: int, seed: int):
    """((train images, labels), (validation images, labels)): ``holdout_indices`` held out, the rest kept."""
    val = holdout_indices(len(labels), holdout, seed)
    keep = np.ones(len(labels), dtype=bool)
    keep[val] = False
    return (images[keep], labels[keep]), (images[val], labels[val])


def build_datasets(
    data: str,
    img_size: int,
    *,
    in_chans: int | None = None,
    train_subset: int | None = None,
    test_subset: int | None = None,
    seed: int = 0,
    check_images: bool = True,
    holdout: int | None = None,
    holdout_seed: int = 0,
) -> DataSplits:
    """Train/test data sets for ``data`` = 'fashion-mnist', 'digits', or an ImageFolder directory path.

    ``holdout``: that many training images (``holdout_indices(.., holdout_seed)``) become the evaluation
    split in place of the test set, and training uses the rest (built-in sets only); ``test_subset`` then
    subsamples the held-out images."""
    if holdout is not None and data not in BUILTIN:
        raise DataError(f"holdout: supported for the built-in sets {list(BUILTIN)}; an image folder has its own "
                        f"val/ split (got data={data!r})")
    if data in BUILTIN:
        if data == "fashion-mnist":
            (xtr, ytr), (xte, yte) = load_fashion_mnist("train"), load_fashion_mnist("test")
            classes, mean, std = fashion_mnist.CLASSES, (0.2860,), (0.3530,)
        else:
            (xtr, ytr), (xte, yte) = digits.load_digits_split("train"), digits.load_digits_split("test")
            classes, mean, std = digits.CLASSES, (0.3,), (0.4,)
        if in_chans not in (None, 1):
            raise DataError(f"in_chans: {data} is grayscale (1 channel), got in_chans={in_chans}")
        if holdout is not None:
            (xtr, ytr), (xte, yte) = split_holdout(xtr, ytr, holdout, holdout_seed)
        xtr, ytr = _subset(xtr, ytr, train_subset, seed)
        xte, yte = _subset(xte, yte, test_subset, seed + 1)
        train = TensorImageDataset(resize_uint8(xtr, img_size), torch.from_numpy(ytr), classes, mean, std)
        test = TensorImageDataset(resize_uint8(xte, img_size), torch.from_numpy(yte), classes, mean, std)
        return DataSplits(train, test, classes, 1)
    root = Path(data)
    train_s, test_s, classes = folder_splits(root, seed=seed)
    if train_subset is not None:
        train_s = [train_s[i] for i in sorted(np.random.default_rng(seed).permutation(len(train_s))[:train_subset])]
    if test_subset is not None:
        test_s = [test_s[i] for i in sorted(np.random.default_rng(seed + 1).permutation(len(test_s))[:test_subset])]
    if not test_s:
        raise DataError(f"{root}: no images left for the test split (need at least 2 images per class)")
    chans = 3 if in_chans is None else in_chans
    if chans not in (1, 3):
        raise DataError(f"in_chans: expected 1 or 3 for an image folder, got {chans}")
    train = FolderDataset(train_s, classes, img_size, chans)
    test = FolderDataset(test_s, classes, img_size, chans)
    if check_images:
        train.check_readable()
        test.check_readable()
    return DataSplits(train, test, classes, chans)


def build_eval_dataset(
    data: str,
    img_size: int,
    *,
    in_chans: int | None = None,
    classes=None,
    test_subset: int | None = None,
    seed: int = 0,
    check_images: bool = True,
) -> Dataset:
    """The data set to score a trained model on: a built-in set's test split, or EVERY image of an image
    folder (its ``val/``/``test/`` split when it has one, else all ``<class>/`` folders: ``folder.eval_samples``).

    ``classes``: the model's class names; a folder's classes are matched to them by name (the dataset's
    ``classes`` are then the model's). ``test_subset``: a seeded subset of N images.
    """
    if data in BUILTIN:
        test = build_datasets(data, img_size, in_chans=in_chans, train_subset=1, test_subset=test_subset,
                              seed=seed, check_images=check_images).test
        if classes is not None and tuple(str(c) for c in classes) != tuple(str(c) for c in test.classes):
            raise DataError(f"{data}: its classes {list(test.classes)} are not the model's ({list(classes)})")
        return test
    samples, names = eval_samples(Path(data), classes)
    if test_subset is not None:
        samples = [samples[i] for i in sorted(np.random.default_rng(seed + 1).permutation(len(samples))[:test_subset])]
    chans = 3 if in_chans is None else in_chans
    if chans not in (1, 3):
        raise DataError(f"in_chans: expected 1 or 3 for an image folder, got {chans}")
    dataset = FolderDataset(samples, names, img_size, chans)
    if check_images:
        dataset.check_readable()
    return dataset


__all__ = [
    "build_eval_dataset",
    "BUILTIN",
    "DataError",
    "DataSplits",
    "FolderDataset",
    "TensorImageDataset",
    "build_datasets",
    "find_fashion_mnist",
    "load_fashion_mnist",
    "read_idx",
    "resize_uint8",
]
