"""One training cell in its own process (``ablate --jobs N``, ``accuracy``):
``python -m laplacianformer.experiments.cell CONFIG RESULT``.

Reads a TrainConfig dict from CONFIG (JSON), trains, and writes the metrics the runner keeps to RESULT
(JSON, atomically).  A SIGTERM/SIGINT interrupts the training; the result then says ``interrupted``.

Two keys of CONFIG that are not TrainConfig fields:
- ``"resume": true``: a run directory that already holds a training checkpoint (a cell killed part-way,
  ``save_every_steps``) is continued from it instead of started again;
- ``"final_test": true``: after training, the final weights are also scored on the data set's test split
  (``final_test_top1``): for runs whose evaluation split is a held-out part of the training set
  (``holdout``), so the test number exists without being what the run reported or selected on.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from .protocol import cell_attn_kwargs

KEEP = ("top1", "top5", "loss", "images_per_s", "params", "wall_time_s", "train_time_s", "steps",
        "epochs_completed", "history", "peak_memory_mb", "run_dir", "interrupted", "eval_split")


def run_cell(config: dict) -> dict:
    """Trains ``config`` (with the two extra keys above) and returns the kept metrics."""
    from ..hub import CHECKPOINT_NAME
    from ..train import TrainConfig, train
    from .common import jsonable as _jsonable

    config = dict(config)
    config["attn_kwargs"] = cell_attn_kwargs(config.get("attn", "laplacian"), config.get("attn_kwargs") or {})
    resume, final_test = bool(config.pop("resume", False)), bool(config.pop("final_test", False))
    out = config.get("out")
    if resume and out and (Path(out) / CHECKPOINT_NAME).is_file():
        result = train(TrainConfig(**config), resume=out)
        result["resumed"] = True
    else:
        result = train(TrainConfig(**config))
    kept = {k: _jsonable(result[k]) for k in (*KEEP, "resumed") if k in result}
    if final_test and not result.get("interrupted"):
        from ..train.evaluate_run import evaluate_checkpoint

        ev = evaluate_checkpoint(result["run_dir"], out=Path(result["run_dir"]) / "final-test", progress=False,
                                 device=config.get("device", "auto"), test_subset=config.get("test_subset"))
        kept["final_test_top1"] = _jsonable(ev["top1"])
        kept["final_test_n"] = _jsonable(ev["n"])
    return kept


def main(argv=None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2:
        print("usage: python -m laplacianformer.experiments.cell CONFIG.json RESULT.json", file=sys.stderr)
        return 2
    from .common import write_json

    with open(args[0]) as fh:
        config = json.load(fh)
    write_json(args[1], run_cell(config))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
