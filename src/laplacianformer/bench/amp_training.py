"""Mixed-precision training check: the micro LaplacianFormer for N steps with --amp off / bf16 / fp16.

    python -m laplacianformer.bench.amp_training             # 200 steps: runs/bench/amp_training/amp_training.*
    python -m laplacianformer.bench.amp_training --publish   # the same into ./benchmarks/results/
    python -m laplacianformer.bench.amp_training --steps 20  # smoke run

Same seed, data order and augmentation for every mode (Fashion-MNIST at 16 px, batch 32; the micro model
narrowed to ``MODEL_KWARGS``, about 0.19M parameters, so 3 × 200 steps fit a few CPU minutes). Recorded per
mode: the loss of every step, steps whose loss was not finite (the trainer stops on one), steps the fp16
GradScaler skipped because a gradient overflowed (its scale dropped), the final scale, whether every weight
is finite at the end, test top-1 / loss, and the largest gap between the mode's 20-step running-mean loss and
the float32 run's.
"""

from __future__ import annotations

import argparse
import math
import tempfile
from pathlib import Path

import torch

from .output import add_output_options, output_stem
from .report import markdown_table, write_json, write_text

MODES = ("off", "bf16", "fp16")
MODEL_KWARGS = {"stem_stride": 2, "depths": [1, 1, 1, 1], "embed_dims": [16, 32, 64, 64], "num_heads": [1, 1, 2, 2]}


def _running_mean(xs: list[float], w: int = 20) -> list[float]:
    return [sum(xs[max(0, i - w + 1) : i + 1]) / len(xs[max(0, i - w + 1) : i + 1]) for i in range(len(xs))]


def run_mode(amp: str, steps: int, data: str, out: Path, threads: int | None) -> dict:
    import json

    from ..train import TrainConfig
    from ..train.engine import Trainer

    config = TrainConfig(data=data, img_size=16, model_kwargs=dict(MODEL_KWARGS), train_subset=32 * steps,
                         test_subset=1000, batch_size=32, epochs=1, max_steps=steps, amp=amp, seed=0,
                         out=str(out / amp), progress=True, warmup_epochs=0.1, threads=threads)
    trainer = Trainer(config)
    scales: list[float] = []
    update = trainer.scaler.update

    def recording_update(*args, **kwargs):
        update(*args, **kwargs)
        scales.append(float(trainer.scaler.get_scale()) if trainer.scaler.is_enabled() else 1.0)

    trainer.scaler.update = recording_update
    error = None
    try:
        result = trainer.fit()
    except FloatingPointError as exc:
        result, error = {}, str(exc)
    finally:
        trainer.close()
    if result.get("interrupted"):
        raise SystemExit(f"amp={amp}: interrupted by {result['interrupted']}")
    losses = [json.loads(line)["loss"] for line in (out / amp / "log.jsonl").read_text().splitlines()]
    skipped = sum(1 for a, b in zip(scales, scales[1:]) if b < a)
    return {
        "amp": amp,
        "steps_run": len(losses),
        "error": error,
        "nonfinite_losses": sum(1 for x in losses if not math.isfinite(x)),
        "skipped_steps": skipped,
        "final_scale": scales[-1] if scales else None,
        "weights_finite": all(bool(torch.isfinite(p).all()) for p in trainer.model.parameters()),
        "first_loss": losses[0] if losses else None,
        "last20_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "test_top1": result.get("top1"),
        "test_loss": result.get("loss"),
        "train_time_s": result.get("train_time_s"),
        "losses": losses,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--data", default="fashion-mnist")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: stable timings on a shared machine)")
    add_output_options(parser)
    args = parser.parse_args(argv)
    stem = output_stem(args, "amp_training", "amp_training")
    with tempfile.TemporaryDirectory() as tmp:
        runs = [run_mode(amp, args.steps, args.data, Path(tmp), args.threads) for amp in MODES]
    ref = _running_mean(runs[0]["losses"])
    for r in runs:
        mine = _running_mean(r["losses"])
        r["max_gap_to_fp32_running_loss"] = max((abs(a - b) for a, b in zip(mine, ref)), default=None)
    header = ["amp", "steps run", "non-finite losses", "GradScaler skipped steps", "final scale", "weights finite",
              "first loss", "mean loss, last 20", "max gap to fp32 running loss", "test top-1", "test loss", "train s"]
    rows = [[r["amp"], r["steps_run"], r["nonfinite_losses"], r["skipped_steps"], r["final_scale"], r["weights_finite"],
             r["first_loss"], r["last20_loss"], r["max_gap_to_fp32_running_loss"], r["test_top1"], r["test_loss"],
             r["train_time_s"]] for r in runs]
    table = markdown_table(header, rows)
    settings = {"steps": args.steps, "threads": args.threads, "data": args.data, "img_size": 16, "batch_size": 32, "model": "laplacianformer_micro",
                "model_kwargs": MODEL_KWARGS}
    write_json(stem.with_suffix(".json"), runs, settings=settings)
    text = (f"# Mixed-precision training, {args.steps} steps ({args.data}, 16 px, batch 32, laplacianformer_micro)\n\n"
            f"Produced by `python -m laplacianformer.bench.amp_training --steps {args.steps}`.\n\n{table}")
    write_text(stem.with_suffix(".md"), text)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for r in runs:
        ax.plot(range(1, len(r["losses"]) + 1), _running_mean(r["losses"]), label=f"amp={r['amp']}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss (20-step running mean)")
    ax.set_title("laplacianformer_micro: float32 vs bf16 vs fp16 autocast")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    plt.close(fig)
    print(text)


if __name__ == "__main__":
    main()
