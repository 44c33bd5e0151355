"""One ablation cell in its own process (``ablate --jobs N``): ``python -m laplacianformer.experiments.cell CONFIG RESULT``.

Reads a TrainConfig dict from CONFIG (JSON), trains, and writes the metrics the runner keeps to RESULT
(JSON, atomically).  A SIGTERM/SIGINT interrupts the training; the result then says ``interrupted``.
"""

from __future__ import annotations

import json
import sys

KEEP = ("top1", "top5", "loss", "images_per_s", "params", "wall_time_s", "train_time_s", "steps",
        "epochs_completed", "history", "peak_memory_mb", "run_dir", "interrupted")


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m laplacianformer.experiments.cell CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    from ..train import TrainConfig, train
    from .ablate import _jsonable
    from .common import write_json

    with open(args[0]) as fh:
        config = json.load(fh)
    result = train(TrainConfig(**config))
    write_json(args[1], {k: _jsonable(result[k]) for k in KEEP if k in result})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
