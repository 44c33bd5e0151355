"""Shared tiny settings: sklearn digits at 16 px and a 4-stage micro backbone a few thousand params wide."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[2]
TINY_MODEL = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}


def tiny_config(out, **kw):
    from laplacianformer.train import TrainConfig

    base = dict(data="digits", img_size=16, train_subset=256, test_subset=128, epochs=1, batch_size=32,
                model_kwargs=dict(TINY_MODEL), out=str(out), progress=False, hflip=False, threads=1)
    base.update(kw)
    return TrainConfig(**base)


def tiny_cli_args(out, *extra):
    return ["train", "--data", "digits", "--img-size", "16", "--train-subset", "256", "--test-subset", "64",
            "--batch-size", "32", "--model-kwargs", json.dumps(TINY_MODEL), "--no-hflip", "--threads", "1",
            "--no-progress", "--out", str(out), *extra]


def cli_env():
    env = dict(os.environ)
    env["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + env.get("PYTHONPATH", "")
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_cli(args, **kw):
    return subprocess.run([sys.executable, "-m", "laplacianformer", *args], env=cli_env(), capture_output=True,
                          text=True, timeout=kw.pop("timeout", 120), **kw)


