"""``laplacianformer demo``: the same small backbone with three token mixers on Fashion-MNIST.

Each variant (laplacian, gaussian, softmax attention in ``laplacianformer_micro``, PVTv2's stride-4 stem,
so 32-px inputs give 8x8, 4x4, 2x2, 1x1 token grids; the softmax baseline without spatial reduction, i.e.
full softmax attention, which is cheap at these sizes) trains in its own
subprocess (``python -m laplacianformer train``) so that its peak resident memory is its own, then is
evaluated on the test split. Each run uses one thread by default (``threads``): for this small model
and batch a second thread costs more in synchronisation than it gains (measured on a busy 2-core machine:
0.32 CPU-s per step with one thread, 2.0 with two). Writes into the output directory: one run directory per variant,
``results.md`` and ``results.json`` (the table) and ``curves.png`` (test accuracy and losses per epoch).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

from ..layers.token_mixer import ATTENTIONS
from .plots import plot_curves

DEFAULTS = dict(train_subset=8000, test_subset=2000, epochs=3, img_size=32, batch_size=64, lr=1.5e-3, threads=1)
QUICK = dict(train_subset=1000, test_subset=500, epochs=2, img_size=32, batch_size=100, lr=1.5e-3, threads=1)
MODEL_KWARGS = {"stem_stride": 4, "sr_ratios": [1, 1, 1, 1]}


def _macs(model: str, attn: str, img_size: int, in_chans: int, model_kwargs: dict) -> float | None:
    """Multiply-accumulates per image from the model registry's counter (None when it is unavailable)."""
    try:
        from ..models import create_model, model_info
    except ImportError:
        return None
    net = create_model(model, num_classes=10, in_chans=in_chans, attn=attn, **model_kwargs)
    info = model_info(net, img_size=img_size)
    for key in ("macs", "flops", "gmacs"):
        if key in info and info[key] is not None:
            return float(info[key]) * (1e9 if key == "gmacs" else 1.0)
    return None


def markdown_table(rows: list[dict]) -> str:
    head = ("| attention | top-1 (%) | top-5 (%) | test loss | params | MACs/image | train images/s "
            "| peak memory (MiB) | train time (s) |\n|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        macs = f"{r['macs'] / 1e6:.1f}M" if r.get("macs") else "n/a"
        lines.append(f"| {r['attn']} | {100 * r['top1']:.2f} | {100 * r['top5']:.2f} | {r['loss']:.3f} "
                     f"| {r['params'] / 1e6:.3f}M | {macs} | {r['images_per_s']:.0f} | {r['peak_memory_mb']:.0f} "
                     f"| {r['train_time_s']:.0f} |")
    return head + "\n".join(lines) + "\n"


def run_demo(out="runs/demo", attns=ATTENTIONS, data="fashion-mnist", quick=False,
             progress=True, **overrides) -> list[dict]:
    """Trains and evaluates each variant; returns the table rows (also written to ``out``)."""
    budget = dict(QUICK if quick else DEFAULTS)
    budget.update({k: v for k, v in overrides.items() if v is not None and k != "time_budget"})
    time_budget = overrides.get("time_budget")
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    rows, histories = [], {}
    t_start = time.perf_counter()
    for attn in attns:
        run_dir = out / attn
        cmd = [sys.executable, "-m", "laplacianformer", "train", "--attn", attn, "--data", data,
               "--out", str(run_dir), "--epochs", str(budget["epochs"]), "--img-size", str(budget["img_size"]),
               "--batch-size", str(budget["batch_size"]), "--train-subset", str(budget["train_subset"]),
               "--test-subset", str(budget["test_subset"]), "--lr", str(budget["lr"]), "--warmup-epochs", "0.3",
               "--model-kwargs", json.dumps(MODEL_KWARGS), "--threads", str(budget["threads"]),
               "--progress" if progress else "--no-progress"]
        if time_budget:
            cmd += ["--time-budget", str(time_budget)]
        print(f"[demo] {attn}: {' '.join(cmd[1:])}", file=sys.stderr, flush=True)
        proc = subprocess.run(cmd, stdout=subprocess.DEVNULL)
        if proc.returncode != 0:
            raise RuntimeError(f"demo: training the {attn} variant failed with exit status {proc.returncode}")
        summary = json.loads((run_dir / "summary.json").read_text())
        from .config import read_train_config
        from .engine import model_kwargs_for

        train_cfg = read_train_config(run_dir)
        cfg = train_cfg.to_dict()
        kw = model_kwargs_for(train_cfg)
        row = {k: summary[k] for k in ("attn", "top1", "top5", "loss", "params", "images_per_s", "peak_memory_mb",
                                       "peak_memory_kind", "train_time_s", "wall_time_s", "steps", "run_dir")}
        row["macs"] = _macs(cfg["model"], attn, cfg["img_size"], 1, kw)
        rows.append(row)
        histories[attn] = summary["history"]
    total = time.perf_counter() - t_start
    table = markdown_table(rows)
    meta = {"data": data, "model": "laplacianformer_micro", **budget, "time_budget": time_budget,
            "total_wall_time_s": total, "python": sys.version.split()[0]}
    try:
        import torch

        meta.update(torch=torch.__version__)
    except ImportError:
        pass
    (out / "results.json").write_text(json.dumps({"settings": meta, "rows": rows}, indent=1) + "\n")
    (out / "results.md").write_text(
        f"Fashion-MNIST demo: {meta['model']}, {budget['train_subset']} training / {budget['test_subset']} test "
        f"images upsampled to {budget['img_size']} px, {budget['epochs']} epochs, batch {budget['batch_size']}; "
        f"total wall time {total:.0f} s.\n\n" + table)
    plot_curves(histories, out / "curves.png", title=f"{meta['model']} on {data}: attention variants")
    print(table)
    print(f"total wall time {total:.0f} s; wrote {out / 'results.md'}, {out / 'results.json'}, {out / 'curves.png'}")
    return rows
