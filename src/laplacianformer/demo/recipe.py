"""The demo's recipe: the model, the training budget (full and ``--quick``), the cost panel's sizes, the
attentions, and the command lines that run them.

The recipe is fixed so that a rerun on the same machine gives the same numbers: ``laplacianformer_micro``
on Fashion-MNIST at 28 px with stem stride 2 (stage 1: 14×14 = 196 tokens ≥ 4 × 49 landmarks, so the
Nyström path is exercised; ``train.geometry``), 32,000 training images for one epoch, batch 128, AdamW lr
2e-3 with a 0.1-epoch warm-up, weight decay 0.01, no drop path, label smoothing, crop or flip; evaluated on
all 10,000 test images; four rows (``ROWS``: the three attentions and the tuned preset). Cost panel: the
three backbones at 224–1024 px (``bench.model_cost``).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from pathlib import Path

from ..bench.model_cost import SIZES
from ..layers.token_mixer import ATTENTIONS, ATTN_PRESETS

MODEL = "laplacianformer_micro"
DEFAULTS = dict(
    data="fashion-mnist", img_size=28, model_kwargs={"stem_stride": 2}, train_subset=32000, test_subset=None,
    epochs=1, batch_size=128, lr=2e-3, warmup_epochs=0.1, weight_decay=0.01, drop_path=0.0, label_smoothing=0.0,
    random_crop=False, hflip=False, threads=1, seed=0,
)
"""The recipe. A probe of the Laplacian model (one thread, full 10,000-image test set): 40,000 training
images, 1 epoch, lr 2e-3 gave 85.95 % (seed 0) and 86.09 % (seed 1), where lr 3e-3 gave 84.70 / 84.54 %
and the full 60,000 images at lr 3e-3 85.53 % in 1.5x the time (docs/MEASUREMENTS.md, "The demo"). 32,000
since the fourth row (the tuned preset), so that four trainings and the cost panel stay within 6 minutes on
2 cores."""
QUICK = {**DEFAULTS, "train_subset": 512, "test_subset": 256, "batch_size": 64}
"""Smoke-test budget (seconds per variant; its numbers are not results)."""
COST = dict(sizes=list(SIZES), repeats=3, max_seconds=20.0, cap_s=30.0)
COST_QUICK = dict(sizes=[32, 64], repeats=1, max_seconds=2.0, cap_s=10.0)
DEMO_ATTENTIONS = ("laplacian", "gaussian", "softmax")
"""The attentions the demo trains: the paper's kernel, the one it is compared with, SR-softmax (the other kernel
families of ``ATTENTIONS`` are the kernel study's: ``laplacianformer kernels``)."""
ROWS = DEMO_ATTENTIONS + tuple(f"laplacian-{p}" for p in ATTN_PRESETS if p != "paper")
"""The demo's rows: each demo attention, then the Laplacian attention with each preset but "paper" (which is the
"laplacian" row): ``laplacian-tuned`` (docs/DESIGN.md §7.6)."""
# expected relative CPU cost per training (measured: softmax-SR ~20 % less than the Laplacian): longest first
ORDER = {"gaussian": 0, "laplacian": 1, "laplacian-tuned": 1, "softmax": 2}


def row_attention(row: str) -> tuple[str, str | None]:
    """A row name of ``ROWS`` -> (attn, attn_preset): "laplacian-tuned" -> ("laplacian", "tuned")."""
    attn, _, preset = row.partition("-")
    return attn, preset or None


def parse_attns(text: str | list | tuple) -> list[str]:
    """Comma-separated row names of ``ROWS`` (or a list) -> list; ValueError naming ``attns`` otherwise."""
    names = [a.strip() for a in text.split(",")] if isinstance(text, str) else [str(a).strip() for a in text]
    names = [a for a in names if a]
    if not names:
        raise ValueError(f"attns: expected one or more of {', '.join(ROWS)}, got {text!r}")
    bad = [a for a in names if a not in ROWS]
    if bad:
        raise ValueError(f"attns: unknown attention {bad[0]!r} (choose from {', '.join(ROWS)})")
    dupes = sorted({a for a in names if names.count(a) > 1})
    if dupes:
        raise ValueError(f"attns: {dupes[0]!r} given twice")
    return names




def budget_of(quick: bool, overrides: dict) -> dict:
    """The recipe (``QUICK`` or ``DEFAULTS``) with ``overrides`` (None: keep); ``model_kwargs`` is merged onto
    the recipe's. TypeError naming an unknown field."""
    budget = {**(QUICK if quick else DEFAULTS)}
    unknown = sorted(set(overrides) - set(budget))
    if unknown:
        raise TypeError(f"{unknown[0]}: not a demo recipe field (expected one of {sorted(budget)})")
    for key, value in overrides.items():
        if value is None:
            continue
        budget[key] = {**budget["model_kwargs"], **value} if key == "model_kwargs" else value
    return budget


def cost_of(quick: bool, sizes: Sequence[int] | None) -> dict:
    """The cost panel's settings (``COST_QUICK`` or ``COST``), with ``sizes`` when given."""
    cfg = dict(COST_QUICK if quick else COST)
    if sizes:
        cfg["sizes"] = sorted(sizes)
    return cfg


def train_command(row: str, run_dir: Path, budget: dict, time_budget: float | None) -> list[str]:
    """``python -m laplacianformer train`` for the row ``row`` (``ROWS``) with every recipe field of ``budget``
    as a flag."""
    attn, preset = row_attention(row)
    cmd = [sys.executable, "-m", "laplacianformer", "train", "--attn", attn, "--model", MODEL,
           *(["--attn-preset", preset] if preset else []),
           "--data", budget["data"], "--out", str(run_dir), "--img-size", str(budget["img_size"]),
           "--model-kwargs", json.dumps(budget["model_kwargs"]), "--epochs", str(budget["epochs"]),
           "--batch-size", str(budget["batch_size"]), "--lr", str(budget["lr"]),
           "--warmup-epochs", str(budget["warmup_epochs"]), "--weight-decay", str(budget["weight_decay"]),
           "--drop-path", str(budget["drop_path"]), "--label-smoothing", str(budget["label_smoothing"]),
           "--random-crop" if budget["random_crop"] else "--no-random-crop",
           "--hflip" if budget["hflip"] else "--no-hflip",
           "--threads", str(budget["threads"]), "--seed", str(budget["seed"]), "--no-progress"]
    for key in ("train_subset", "test_subset"):
        if budget[key] is not None:
            cmd += [f"--{key.replace('_', '-')}", str(budget[key])]
    if time_budget:
        cmd += ["--time-budget", str(time_budget)]
    return cmd


def cost_command(stem: Path, cost: dict, threads: int, attns: Sequence[str]) -> list[str]:
    """The cost panel's subprocess (``bench.model_cost``, writing ``stem``.json/.md/.png): the demo's
    attentions (``ATTENTIONS`` among ``attns``; a preset row costs what its attention costs, within the
    key projection that tied keys save) at the panel's sizes."""
    attns = [a for a in attns if a in ATTENTIONS]
    return [sys.executable, "-m", "laplacianformer.bench.model_cost", "--out", str(stem), "--threads", str(threads),
            "--attns", ",".join(attns), "--sizes", *map(str, cost["sizes"]), "--repeats", str(cost["repeats"]),
            "--max-seconds", str(cost["max_seconds"]), "--cap-s", str(cost["cap_s"])]
