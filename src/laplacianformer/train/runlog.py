"""Run-directory logs: one JSON line per training step, one CSV/JSON row per epoch."""

from __future__ import annotations

import csv
import json
from pathlib import Path

STEP_LOG = "log.jsonl"
EPOCH_CSV = "epochs.csv"
EPOCH_JSON = "epochs.json"


class StepLog:
    """Appends ``{"step": ..., ...}`` lines to ``log.jsonl``, flushed after every line."""

    def __init__(self, run_dir: Path, resume_step: int | None = None) -> None:
        self.path = Path(run_dir) / STEP_LOG
        if resume_step is not None and self.path.exists():
            truncate_step_log(self.path, resume_step)
        self._f = open(self.path, "a", encoding="utf-8")

    def write(self, row: dict) -> None:
        self._f.write(json.dumps(row) + "\n")
        self._f.flush()

    def close(self) -> None:
        self._f.close()


def truncate_step_log(path: Path, last_step: int) -> None:
    """Drops lines after global step ``last_step`` (steps replayed after a resume are logged again)."""
    keep = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        if row.get("step", 0) <= last_step:
            keep.append(line)
    path.write_text("".join(k + "\n" for k in keep), encoding="utf-8")


def write_epochs(run_dir: Path, rows: list[dict]) -> None:
    """Rewrites ``epochs.csv`` and ``epochs.json`` from the full history (small; keeps them consistent)."""
    run_dir = Path(run_dir)
    (run_dir / EPOCH_JSON).write_text(json.dumps(rows, indent=1) + "\n")
    if not rows:
        return
    keys = list(rows[0])
    with open(run_dir / EPOCH_CSV, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=keys, extrasaction="ignore")
        w.writeheader()
        w.writerows(rows)
