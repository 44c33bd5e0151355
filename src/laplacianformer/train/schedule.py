"""Learning-rate schedule: linear warm-up then cosine decay, evaluated per optimiser step.

The schedule is a pure function of the step number, so its only state is the step counter held by the
trainer (nothing to pickle; resuming sets the same step and gets the same rate).
"""

from __future__ import annotations

import math


def lr_at(step: int, *, total_steps: int, warmup_steps: int, base_lr: float, min_lr: float) -> float:
    """Rate before optimiser step ``step`` (0-based): warm-up from base_lr/warm-up length to base_lr, then cosine to min_lr."""
    if warmup_steps > 0 and step < warmup_steps:
        return base_lr * (step + 1) / warmup_steps
    decay = max(1, total_steps - warmup_steps)
    t = min(1.0, (step - warmup_steps) / decay)
    return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * t))
