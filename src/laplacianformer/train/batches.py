"""Deterministic, resumable batch order: ``DistributedSampler`` (seeded per epoch) + skipping to a step.

For in-memory data sets (``TensorImageDataset``) batches are gathered by index with no DataLoader; for
image folders a DataLoader decodes them (``num_workers`` processes) with its own generator, so the
global torch RNG is never consumed by data loading and a resumed run sees the same batches.
"""

from __future__ import annotations

import math

import torch
from torch.utils.data import DataLoader, DistributedSampler


def epoch_indices(n: int, *, epoch: int, seed: int, rank: int, world: int, shuffle: bool = True) -> list[int]:
    """This rank's sample order for ``epoch`` (padded to equal length over ranks, as DistributedSampler does)."""
    sampler = DistributedSampler(range(n), num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    return list(sampler)


def steps_per_epoch(n: int, batch_size: int, world: int) -> int:
    return max(1, math.ceil(math.ceil(n / world) / batch_size))


def iterate(dataset, indices: list[int], batch_size: int, *, start_step: int = 0, num_workers: int = 0):
    """Yields (images uint8 (B, C, S, S), labels int64 (B,)) for ``indices`` from batch ``start_step`` on."""
    rest = indices[start_step * batch_size:]
    if hasattr(dataset, "batch"):
        for i in range(0, len(rest), batch_size):
            yield dataset.batch(torch.tensor(rest[i:i + batch_size], dtype=torch.long))
        return
    loader = DataLoader(dataset, batch_size=batch_size, sampler=rest, num_workers=num_workers,
                        generator=torch.Generator().manual_seed(0), persistent_workers=False)
    yield from loader


def shard_indices(n: int, rank: int, world: int) -> list[int]:
    """Evaluation sharding without padding (every sample counted exactly once over ranks)."""
    return list(range(rank, n, world))
