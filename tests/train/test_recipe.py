"""Recipe pieces: schedule, augmentation/mixup determinism and target sums, config validation, RNG state."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from laplacianformer.checkpoint import load_checkpoint, save_checkpoint
from laplacianformer.train import TrainConfig
from laplacianformer.train.augment import mix_batch, one_hot_smooth, random_crop_flip
from laplacianformer.train.batches import epoch_indices
from laplacianformer.train.schedule import lr_at
from laplacianformer.train.state import capture_rng, restore_rng


def test_warmup_then_cosine():
    kw = dict(total_steps=100, warmup_steps=10, base_lr=1.0, min_lr=0.01)
    lrs = [lr_at(s, **kw) for s in range(100)]
    assert lrs[0] == pytest.approx(0.1) and lrs[9] == pytest.approx(1.0)
    assert all(a >= b for a, b in zip(lrs[9:], lrs[10:]))
    assert lr_at(100, **kw) == pytest.approx(0.01)


def test_crop_flip_and_mix_are_seeded():
    x = torch.randint(0, 256, (8, 1, 16, 16), dtype=torch.uint8)
    a = random_crop_flip(x, torch.Generator().manual_seed(3), pad=2, crop=True, flip=True)
    b = random_crop_flip(x, torch.Generator().manual_seed(3), pad=2, crop=True, flip=True)
    assert torch.equal(a, b) and a.shape == x.shape and not torch.equal(a, x)
    y = torch.arange(8) % 4
    xf = x.float()
    for seed in range(6):
        m1, t1 = mix_batch(xf, y, torch.Generator().manual_seed(seed), num_classes=4, mixup=0.8, cutmix=1.0,
                           prob=1.0, smoothing=0.1)
        m2, t2 = mix_batch(xf, y, torch.Generator().manual_seed(seed), num_classes=4, mixup=0.8, cutmix=1.0,
                           prob=1.0, smoothing=0.1)
        assert torch.equal(m1, m2) and torch.equal(t1, t2)
        torch.testing.assert_close(t1.sum(1), torch.ones(8))
    plain, target = mix_batch(xf, y, torch.Generator(), num_classes=4, mixup=0, cutmix=0, prob=1, smoothing=0.1)
    assert plain is xf and torch.equal(target, one_hot_smooth(y, 4, 0.1))
    assert target[0, 0] == pytest.approx(0.925)


def test_epoch_order_is_seeded_and_sharded():
    a = epoch_indices(10, epoch=1, seed=5, rank=0, world=1)
    assert a == epoch_indices(10, epoch=1, seed=5, rank=0, world=1)
    assert a != epoch_indices(10, epoch=2, seed=5, rank=0, world=1) and sorted(a) == list(range(10))
    r0 = epoch_indices(10, epoch=0, seed=0, rank=0, world=2)
    r1 = epoch_indices(10, epoch=0, seed=0, rank=1, world=2)
    assert len(r0) == len(r1) == 5 and set(r0) | set(r1) == set(range(10))


@pytest.mark.parametrize("field,value", [("lr", -1.0), ("epochs", 0), ("amp", "fp8"), ("label_smoothing", 2.0),
                                         ("attn", "linear"), ("clip_grad", 0.0), ("in_chans", 2)])
def test_config_errors_name_the_field(field, value):
    with pytest.raises((ValueError, TypeError), match=f"^{field}:"):
        TrainConfig(**{field: value}).validate()


def test_config_json_roundtrip(tmp_path):
    c = TrainConfig(attn="gaussian", attn_kwargs={"lam": 2.0}, epochs=3)
    c.save(tmp_path / "c.json")
    assert TrainConfig.load(tmp_path / "c.json") == c


def test_rng_state_survives_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1), np.random.seed(2), random.seed(3)
    np.random.randn()
    save_checkpoint({"rng": capture_rng()}, tmp_path / "r.pt")
    expected = (torch.rand(3), np.random.rand(3), np.random.randn(), random.random())
    torch.manual_seed(9), np.random.seed(9), random.seed(9)
    restore_rng(load_checkpoint(tmp_path / "r.pt")["rng"])
    got = (torch.rand(3), np.random.rand(3), np.random.randn(), random.random())
    assert torch.equal(got[0], expected[0]) and np.array_equal(got[1], expected[1])
    assert got[2] == expected[2] and got[3] == expected[3]
