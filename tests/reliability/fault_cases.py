"""Fault-injection helpers shared by tests/reliability/test_checkpoint.py and benchmarks/robustness.py."""

from __future__ import annotations

import time
from pathlib import Path

import torch


def slow_saving_loop(path: Path, pause_s: float) -> None:
    """Child process: save ever-newer 4 MiB checkpoints forever, pausing every 256 KiB of payload so that
    a kill lands mid-write most of the time."""
    from laplacianformer import checkpoint as ckpt

    torch.set_num_threads(1)
    original = ckpt._write_payload

    def slow(f, data):
        view = memoryview(data)
        for start in range(0, len(view), 1 << 18):
            original(f, view[start : start + (1 << 18)])
            time.sleep(pause_s)

    ckpt._write_payload = slow
    step = 0
    while True:
        step += 1
        ckpt.save_checkpoint({"step": step, "w": torch.full((1 << 20,), float(step))}, path)
