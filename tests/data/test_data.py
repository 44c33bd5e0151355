"""Data loaders: IDX parsing, the Fashion-MNIST search path and its error, digits, ImageFolder errors."""

from __future__ import annotations

import gzip
import struct

import numpy as np
import pytest

from laplacianformer.data import DataError, build_datasets, read_idx
from laplacianformer.data import fashion_mnist


def _write_idx(path, arr):
    header = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape)
    with gzip.open(path, "wb") as f:
        f.write(header + arr.astype(np.uint8).tobytes())


def _fake_fashion(dirpath, n_train=12, n_test=6):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("t10k", n_test)):
        _write_idx(dirpath / f"{split}-images-idx3-ubyte.gz", rng.integers(0, 256, (n, 28, 28)))
        _write_idx(dirpath / f"{split}-labels-idx1-ubyte.gz", np.arange(n) % 10)


def test_read_idx_roundtrip_and_offsets(tmp_path):
    arr = np.random.default_rng(1).integers(0, 256, (3, 28, 28)).astype(np.uint8)
    _write_idx(tmp_path / "x.gz", arr)
    np.testing.assert_array_equal(read_idx(tmp_path / "x.gz"), arr)
    raw = gzip.decompress((tmp_path / "x.gz").read_bytes())
    assert raw[16:] == arr.tobytes()
    (tmp_path / "bad.gz").write_bytes(gzip.compress(raw[:-5]))
    with pytest.raises(DataError, match="bad.gz"):
        read_idx(tmp_path / "bad.gz")


def test_fashion_mnist_found_through_env_var(tmp_path, monkeypatch):
    _fake_fashion(tmp_path)
    monkeypatch.setenv("LAPLACIANFORMER_DATA", str(tmp_path))
    x, y = fashion_mnist.load_fashion_mnist("test")
    assert x.shape == (6, 28, 28) and y.tolist() == [0, 1, 2, 3, 4, 5]


def test_fashion_mnist_missing_names_the_install_command(tmp_path, monkeypatch):
    monkeypatch.setenv("LAPLACIANFORMER_DATA", str(tmp_path))
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setattr(fashion_mnist, "SYSTEM_DIR", tmp_path / "nowhere")
    with pytest.raises(DataError, match="apt-get install dataset-fashion-mnist"):
        fashion_mnist.find_fashion_mnist()


def test_real_fashion_mnist_if_installed():
    if not (fashion_mnist.SYSTEM_DIR / "t10k-labels-idx1-ubyte.gz").exists():
        pytest.skip("dataset-fashion-mnist not installed")
    x, y = fashion_mnist.load_fashion_mnist("test")
    assert x.shape == (10000, 28, 28) and x.dtype == np.uint8
    assert np.bincount(y).tolist() == [1000] * 10


def test_digits_split_sizes_and_upsampling():
    s = build_datasets("digits", 16)
    assert len(s.train) + len(s.test) == 1797 and s.in_chans == 1
    assert s.train.images.shape[1:] == (1, 16, 16)
    assert set(s.train.labels.tolist()) == set(range(10))


def _png(path, value=128):
    from PIL import Image

    Image.fromarray(np.full((10, 12, 3), value, np.uint8)).save(path)


def test_image_folder_layout_and_errors(tmp_path):
    with pytest.raises(DataError, match="does not exist"):
        build_datasets(str(tmp_path / "missing"), 16)
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match="no class folders"):
        build_datasets(str(tmp_path / "empty"), 16)
    root = tmp_path / "imgs"
    for c in ("cat", "dog"):
        (root / c).mkdir(parents=True)
        for i in range(5):
            _png(root / c / f"{i}.png", 40 * i)
    s = build_datasets(str(root), 16)
    assert s.classes == ("cat", "dog") and len(s.train) == 8 and len(s.test) == 2
    img, label = s.train[0]
    assert img.shape == (3, 16, 16) and label in (0, 1)
    (root / "dog" / "broken.png").write_bytes(b"\x89PNG\r\n\x1a\n not really")
    with pytest.raises(DataError, match="broken.png"):
        build_datasets(str(root), 16)


def test_eval_samples_take_every_image_and_match_classes_by_name(tmp_path):
    from laplacianformer.data import build_eval_dataset
    from laplacianformer.data.folder import eval_samples

    root = tmp_path / "imgs"
    for c, n in (("dog", 2), ("cat", 3)):
        (root / c).mkdir(parents=True)
        for i in range(n):
            _png(root / c / f"{i}.png", 30 * i)
    samples, classes = eval_samples(root)
    assert classes == ("cat", "dog") and len(samples) == 5
    samples, classes = eval_samples(root, classes=("bird", "dog", "cat"))
    assert classes == ("bird", "dog", "cat") and sorted(label for _, label in samples) == [1, 1, 2, 2, 2]
    with pytest.raises(DataError, match="class folders \\['cat'\\] are not classes of the model"):
        eval_samples(root, classes=("dog",))
    ds = build_eval_dataset(str(root), 16, classes=("cat", "dog"))
    assert len(ds) == 5 and ds.classes == ("cat", "dog")
    split = tmp_path / "split"
    (split / "val").mkdir(parents=True)
    (root / "cat").rename(split / "val" / "cat")
    assert len(eval_samples(split)[0]) == 3  # only val/: its images
    with pytest.raises(DataError, match="has val/ but no train/"):
        build_datasets(str(split), 16)
