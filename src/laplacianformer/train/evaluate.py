"""Evaluation: loss, top-1/top-5, per-class accuracy and the confusion matrix of a classifier."""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F
from torch import nn

from .augment import normalize
from .batches import iterate, shard_indices
from .distributed import DistInfo, all_reduce_sum
from .progress import ProgressLine, progress_mode


def autocast_context(device: torch.device, amp: str):
    """torch.autocast for amp 'bf16' / 'fp16'; a null context for 'off'."""
    if amp == "off":
        return contextlib.nullcontext()
    dtype = torch.bfloat16 if amp == "bf16" else torch.float16
    return torch.autocast(device_type=device.type, dtype=dtype)


@torch.no_grad()
def evaluate(
    model: nn.Module,
    dataset,
    *,
    batch_size: int = 256,
    device: str | torch.device = "cpu",
    amp: str = "off",
    num_classes: int | None = None,
    progress: bool | str = False,
    num_workers: int = 0,
    dist_info: DistInfo | None = None,
    desc: str = "eval",
) -> dict:
    """Evaluates ``model`` on every item of ``dataset`` (items: uint8 (C, S, S) images, int labels).

    Returns a dict: ``loss`` (mean cross-entropy, no smoothing), ``top1``, ``top5`` (fractions in [0, 1]),
    ``per_class`` (accuracy per class, None for classes without samples), ``confusion`` (K x K counts,
    rows true, columns predicted) and ``n``. Under DDP each rank takes a shard and the counts are summed.
    ``progress`` (main rank): True -> a tqdm bar on a terminal, else a line at least every 30 s (``"lines"``:
    always lines); False -> nothing (``progress.progress_mode``).
    """
    from tqdm.auto import tqdm

    info = dist_info or DistInfo()
    device = torch.device(device)
    k = num_classes or len(dataset.classes)
    mean, std = dataset.mean, dataset.std
    was_training = model.training
    model.eval()
    conf = torch.zeros(k, k, dtype=torch.float64, device=device)
    sums = torch.zeros(3, dtype=torch.float64, device=device)
    idx = shard_indices(len(dataset), info.rank, info.world_size)
    n_batches = (len(idx) + batch_size - 1) // batch_size
    mode = progress_mode(progress) if info.is_main else "off"
    bar = tqdm(iterate(dataset, idx, batch_size, num_workers=num_workers), total=n_batches, desc=desc,
               disable=mode != "bars", leave=False, dynamic_ncols=True)
    timed = ProgressLine(desc, n_batches, unit="batch", enabled=mode == "lines")
    for images, labels in bar:
        x = normalize(images.to(device), mean, std)
        y = labels.to(device)
        with autocast_context(device, amp):
            logits = model(x)
        logits = logits.float()
        batch_loss = F.cross_entropy(logits, y, reduction="sum").item()
        sums[0] += batch_loss
        top = logits.topk(min(5, logits.shape[1]), dim=1).indices
        sums[1] += (top[:, 0] == y).sum().item()
        sums[2] += (top == y[:, None]).any(1).sum().item()
        conf.index_put_((y, top[:, 0]), torch.ones_like(y, dtype=torch.float64), accumulate=True)
        timed.update(images=len(y) * info.world_size, loss=batch_loss / max(len(y), 1))
    bar.close()
    all_reduce_sum(conf, info)
    all_reduce_sum(sums, info)
    model.train(was_training)
    n = int(conf.sum().item())
    if n == 0:
        raise ValueError("dataset: no samples to evaluate")
    rows = conf.sum(1)
    per_class = [float(conf[i, i] / rows[i]) if rows[i] > 0 else None for i in range(k)]
    return {
        "loss": float(sums[0] / n),
        "top1": float(sums[1] / n),
        "top5": float(sums[2] / n),
        "per_class": per_class,
        "confusion": conf.long().tolist(),
        "n": n,
    }
