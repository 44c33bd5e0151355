"""Command-line interface: ``laplacianformer {train,eval,predict,info,build,export,bench,demo,data,detect,ablate,analyze,accuracy,kernels} ...``.

User errors (bad flag values, missing or corrupt data, unreadable checkpoints) end the process with exit
status 2 and one line on stderr naming the flag or path; ``--debug`` shows the traceback instead.
An interrupted training run (SIGINT/SIGTERM) checkpoints and exits with 128 + the signal number.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from .cmdline import json_object, nonneg_float, positive_float, positive_int, run_main

PROG = "laplacianformer"


class UserError(ValueError):
    """A problem the user can fix; printed as one line."""


class _Parser(argparse.ArgumentParser):
    """argparse that reports a bad flag in one line (no usage block) and exits with status 2."""

    def error(self, message: str):
        raise UserError(message)


_json_dict = json_object('{"lam": 2.0}')


_BOOL = argparse.BooleanOptionalAction


def _flag_specs() -> dict[str, dict]:
    """Every flag shared by the sub-commands, written once: its type/choices/action and help."""
    from .layers.token_mixer import ATTENTIONS, ATTN_PRESETS
    from .train.config import AMP_MODES

    return {
        "--model": dict(help="registered model name (default laplacianformer_micro)"),
        "--attn": dict(choices=ATTENTIONS, help="token mixer"),
        "--attn-kwargs": dict(type=_json_dict,
                              help='JSON object passed to every attention layer, e.g. \'{"lam": 2.0, "iters": 10}\''),
        "--attn-preset": dict(choices=tuple(ATTN_PRESETS),
                              help="named --attn-kwargs of the Laplacian attention (paper: the defaults; tuned: lam 0.5, "
                                   "inline normalisation, tied keys; docs/DESIGN.md §7.6); --attn-kwargs override it"),
        "--model-kwargs": dict(type=_json_dict, help='JSON object of model overrides, e.g. \'{"stem_stride": 4}\''),
        "--data": dict(help="fashion-mnist (default), digits, or an ImageFolder directory"),
        "--img-size": dict(type=positive_int, help="square input size in pixels (default 32)"),
        "--in-chans": dict(type=int, help="1 or 3 (default: from the data)"),
        "--train-subset": dict(type=positive_int, help="use a seeded subset of N training images"),
        "--test-subset": dict(type=positive_int, help="use a seeded subset of N test images"),
        "--epochs": dict(type=positive_int),
        "--batch-size": dict(type=positive_int),
        "--eval-batch-size": dict(type=positive_int),
        "--lr": dict(type=positive_float, help="peak AdamW learning rate (default 1e-3)"),
        "--min-lr": dict(type=nonneg_float),
        "--weight-decay": dict(type=nonneg_float),
        "--warmup-epochs": dict(type=nonneg_float),
        "--label-smoothing": dict(type=nonneg_float),
        "--mixup": dict(type=nonneg_float, help="mixup alpha (0: off)"),
        "--cutmix": dict(type=nonneg_float, help="CutMix alpha (0: off)"),
        "--randaugment": dict(action=_BOOL),
        "--random-crop": dict(action=_BOOL),
        "--hflip": dict(action=_BOOL),
        "--drop-path": dict(type=nonneg_float),
        "--clip-grad": dict(type=positive_float),
        "--ema": dict(action=_BOOL),
        "--ema-decay": dict(type=nonneg_float),
        "--amp": dict(choices=AMP_MODES),
        "--seed": dict(type=int),
        "--num-workers": dict(type=int),
        "--max-steps": dict(type=positive_int, help="stop after N optimiser steps in total"),
        "--time-budget": dict(type=positive_float, help="stop after this many seconds"),
        "--save-every-steps": dict(type=positive_int, help="also checkpoint every N steps"),
        "--progress": dict(action=_BOOL, help="tqdm bars on a terminal (default on); without a terminal or with "
                                                 "--no-progress: one line per epoch on stderr"),
        "--log-every": dict(type=positive_int, help="also print a progress line every N optimiser steps"),
        "--verify-images": dict(action=_BOOL, help="decode every image of a folder before training (default on)"),
        "--device": dict(help="auto (default), cpu, cuda, cuda:N"),
        "--threads": dict(type=positive_int, help="torch.set_num_threads"),
    }


def _add_flags(p: argparse.ArgumentParser, specs: dict, default, *names: str, **changes) -> None:
    """Add the shared flags ``names`` with ``default``; ``changes`` maps a flag's dest to spec updates."""
    for name in names:
        p.add_argument(name, default=default, **{**specs[name], **changes.get(name[2:].replace("-", "_"), {})})


def _attns(text: str) -> list[str]:
    from .demo.recipe import parse_attns

    try:
        return parse_attns(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e).partition(": ")[2]) from None


_attns.__name__ = "attention list"


def _add_demo_parser(sub, specs: dict) -> None:
    """The ``demo`` sub-command; each help line shows the default (and ``--quick``'s where it differs)."""
    from .demo.recipe import COST, COST_QUICK, DEFAULTS, QUICK, ROWS

    def default(key, fmt=str):
        d, q = DEFAULTS[key], QUICK[key]
        shown = "all" if d is None else fmt(d)
        return f"default {shown}" + ("" if q == d else f"; --quick {fmt(q)}")

    p = sub.add_parser(
        "demo", help="train laplacian/gaussian/softmax (and laplacian-tuned) micro models on Fashion-MNIST and measure cost vs resolution",
        description="Trains laplacianformer_micro with each attention and the Laplacian attention's tuned preset "
                    "(28 px, stem stride 2, "
                    f"{DEFAULTS['train_subset']:,} training images, one epoch; evaluated on all 10,000 test images) "
                    "and measures time and peak memory per "
                    "image of the three backbones at 224-1024 px. Writes OUT/results.{json,md}, curves.png, cost.png "
                    "and one run directory per attention.")
    p.add_argument("--out", default="runs/demo", help="output directory (default runs/demo)")
    p.add_argument("--publish", metavar="DIR", default=None,
                   help="also copy results.json, results.md, curves.png and cost.png into DIR (e.g. docs/demo)")
    p.add_argument("--attns", type=_attns, default=list(ROWS),
                   help=f"comma-separated rows: attentions, laplacian-PRESET (default {','.join(ROWS)})")
    p.add_argument("--jobs", type=positive_int, default=2,
                   help="subprocesses at a time, each single-threaded by default (default 2: one per core)")
    p.add_argument("--quick", action="store_true",
                   help="smoke-test budget: 512 training / 256 test images, cost panel at 32 and 64 px")
    p.add_argument("--seed", type=int, default=None,
                   help="seed of data order and initialisation (" + default("seed") + ")")
    p.add_argument("--lr", type=positive_float, default=None, help="peak AdamW learning rate (" + default("lr") + ")")
    p.add_argument("--model-kwargs", type=_json_dict, default=None,
                   help="JSON object merged onto the recipe's model overrides (" + default("model_kwargs", json.dumps)
                        + "); stage 1 must keep >= 4 tokens per landmark")
    for flag, what in (("--train-subset", "training images"), ("--test-subset", "test images"),
                       ("--epochs", "epochs"), ("--img-size", "input size in pixels"), ("--batch-size", "batch size")):
        key = flag[2:].replace("-", "_")
        _add_flags(p, specs, None, flag, **{key: dict(help=f"{what} ({default(key)})")})
    _add_flags(p, specs, None, "--threads", threads=dict(help=f"threads per subprocess ({default('threads')})"))
    _add_flags(p, specs, None, "--time-budget",
               time_budget=dict(help="seconds per training (safety stop; default none)"))
    _add_flags(p, specs, "fashion-mnist", "--data", data=dict(help="data set (default fashion-mnist)"))
    p.add_argument("--cost-sizes", type=positive_int, nargs="+", default=None,
                   help=f"image sides of the cost panel (default {' '.join(map(str, COST['sizes']))}; "
                        f"--quick {' '.join(map(str, COST_QUICK['sizes']))})")
    p.add_argument("--no-cost", dest="cost", action="store_false", help="skip the cost panel")
    _add_flags(p, specs, True, "--progress", progress=dict(help="one line per started/finished job and every 30 s"))


# the sub-commands handled by an experiments module's own parser (arguments forwarded as they are)
FORWARDED = ("ablate", "analyze", "accuracy", "kernels")


def build_parser() -> argparse.ArgumentParser:
    specs = _flag_specs()
    parser = _Parser(prog=PROG, description="LaplacianFormer: train, evaluate, inspect and benchmark.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors (accepted anywhere)")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    p = sub.add_parser("train", help="train a model (DDP under torchrun)")
    p.add_argument("--config", help="a train_config.json to start from (flags override it)")
    p.add_argument("--out", default=argparse.SUPPRESS, help="run directory (default runs/<model>-<attn>-<time>)")
    p.add_argument("--resume", metavar="RUN_DIR", help="continue a run from its checkpoint (flags override its config)")
    p.add_argument("--allow-schedule-change", action="store_true",
                   help="with --resume: accept flags (--epochs, --max-steps, --warmup-epochs, --batch-size) that "
                        "change the learning-rate schedule; the warm-up/cosine then spans the new length")
    # suppressed defaults: only flags given on the command line override the base config
    _add_flags(p, specs, argparse.SUPPRESS, *specs)

    p = sub.add_parser("eval", help="evaluate a checkpoint: top-1/top-5, loss, per-class accuracy, confusion PNG")
    p.add_argument("--checkpoint", required=True,
                   help="a run directory, its checkpoint.safetensors, a .safetensors weights file, or a timm "
                        "train.py checkpoint (model_best.pth.tar, ...) or .pth state dict (with --no-verify)")
    _add_flags(p, specs, None, "--data", "--model", "--test-subset",
               data=dict(help="data to score: an image folder (every image in it; its val/ or test/ split when it "
                              "has one) or a built-in set (its test split); default: the test split of the run's "
                              "data (required for weights without a run: timm checkpoints, state dicts)"),
               model=dict(help="override the model name stored with the checkpoint (required for weights "
                               "that name none, e.g. a .pth state dict)"))
    _add_flags(p, specs, 256, "--batch-size")
    _add_flags(p, specs, "off", "--amp")
    p.add_argument("--ema", action="store_true", help="evaluate the EMA weights (a timm checkpoint's state_dict_ema)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="accept a torch.save file without laplacianformer's integrity trailer (timm's .pth.tar, a "
                        ".pth state dict); still read with weights_only=True, but not checked for alteration")
    p.add_argument("--out", help="where to write eval.json and confusion.png (default: the run directory)")
    _add_flags(p, specs, "auto", "--device")
    _add_flags(p, specs, True, "--progress")

    _add_predict_parser(sub, specs)

    sub.add_parser("build", help="compile the C kernels of the CPU path now (else at their first use) and print "
                                 "each library's status; exit 1 when one cannot be built",
                   description="Builds ops/kernel/csrc/pairwise.c, ops/newton_schulz/csrc/newton_schulz.c and "
                               "ops/csrc/normalization.c into the cache ($LAPLACIANFORMER_CACHE, else "
                               "$XDG_CACHE_HOME/laplacianformer, else ~/.cache/laplacianformer).")
    p = sub.add_parser("info", help="parameters, FLOPs and per-stage shapes of a model; --dispatch: backends")
    p.add_argument("model", nargs="?", help="e.g. laplacianformer_tiny")
    p.add_argument("--img-size", type=positive_int, default=224)
    p.add_argument("--dispatch", action="store_true",
                   help="print each op's backend decision for laplacian_attention at --shape (no model needed)")
    p.add_argument("--shape", default="1,2,3136,32", help="B,H,N,d of q, k and v (default 1,2,3136,32)")
    p.add_argument("--dtype", choices=("float32", "float64", "float16", "bfloat16"), default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--hw", default=None, help="token grid H,W with H*W = N (default: square N, else 1-D)")
    p.add_argument("--landmarks", default=None, help="lh,lw (2-D) or m (1-D); default 7,7 or 49")
    p.add_argument("--backward", action="store_true", help="also run the backward (the solver's implicit gradient)")

    p = sub.add_parser("bench", help="run benchmarks (results under runs/bench/ of the current directory)",
                       epilog="Options after one NAME that are not listed here go to that benchmark, e.g. "
                              "'laplacianformer bench cpu_inference --runtimes eager bf16 --sizes 512'; its own "
                              "options: python -m laplacianformer.bench.NAME --help.")
    p.add_argument("names", nargs="*", help="benchmark names (default: all); see --list")
    p.add_argument("--quick", action="store_true", help="smoke-test sizes (seconds each; the numbers are not results)")
    p.add_argument("--list", action="store_true", help="list the available benchmarks")
    from .bench.output import add_publish_option

    add_publish_option(p)

    _add_demo_parser(sub, specs)
    _add_export_parser(sub)

    from .data.scenes import add_scenes_arguments

    p = sub.add_parser("data", help="make data sets: 'scenes' writes FashionScenes (COCO-format detection)")
    data_sub = p.add_subparsers(dest="data_command", required=True, metavar="{scenes}")
    add_scenes_arguments(data_sub.add_parser(
        "scenes", help="FashionScenes: Fashion-MNIST items composed into COCO-format scenes (docs/DETECTION.md)",
        description="Writes DIR/{train,val}/*.png and DIR/annotations/instances_{train,val}.json (COCO): "
                    "boxes, areas and RLE instance masks of Fashion-MNIST items on textured backgrounds; "
                    "train scenes use the training file, val scenes the test file. Same seed, same files."))

    from .detection.cli import add_detect_parser

    add_detect_parser(sub)

    for name in FORWARDED:
        p = sub.add_parser(name, help=f"forwarded to laplacianformer.experiments.{name} (see its --help)",
                           add_help=False)
        p.add_argument("rest", nargs=argparse.REMAINDER)
    return parser


def _add_predict_parser(sub, specs: dict) -> None:
    """The ``predict`` sub-command (``cmd_predict``; the work in ``train/predict.py``)."""
    p = sub.add_parser(
        "predict", help="classify image files or folders with a run or saved model: top-k classes and probabilities",
        description="Prints one line per image: its path and the top-k classes with their probabilities. Images "
                    "are read with the model's own preprocessing (a run's image size, mean/std and whole-image "
                    "bilinear resize; a timm checkpoint's pretrained cfg), in any mode PIL reads (grayscale, "
                    "RGB, RGBA, palette) and size; folders give every image file under them.")
    p.add_argument("--run", required=True,
                   help="a training run directory (its best weights), a saved model directory (save_pretrained), "
                        "or a weights file: a timm train.py checkpoint or .pth state dict (with --no-verify)")
    p.add_argument("images", nargs="+", metavar="IMAGE_OR_FOLDER", help="image files and folders of images")
    p.add_argument("--top-k", type=positive_int, default=5, help="classes per image (default 5, at most all)")
    p.add_argument("--json", metavar="FILE", help="also write the predictions as JSON")
    p.add_argument("--csv", metavar="FILE", help="also write one CSV row per image: path, class_1, prob_1, ...")
    _add_flags(p, specs, 64, "--batch-size", batch_size=dict(help="images per forward pass (default 64)"))
    _add_flags(p, specs, None, "--model",
               model=dict(help="registered model name, for a weights file that names none (a .pth state dict)"))
    p.add_argument("--ema", action="store_true",
                   help="the EMA weights (a run's model_ema.safetensors, a timm checkpoint's state_dict_ema)")
    p.add_argument("--no-verify", dest="verify", action="store_false",
                   help="accept a torch.save file without laplacianformer's integrity trailer (timm's .pth.tar)")
    _add_flags(p, specs, "auto", "--device")
    _add_flags(p, specs, None, "--threads")
    p.add_argument("--retain-heap", action=argparse.BooleanOptionalAction, default=True,
                   help="keep freed memory mapped for reuse (glibc; laplacianformer.retain_freed_memory): no page "
                        "faults on the next batch's tensors; the process keeps its peak heap until it exits "
                        "(default on)")
    _add_flags(p, specs, True, "--progress",
               progress=dict(help="a bar on a terminal, else a line every 30 s on stderr (default on)"))


def _add_export_parser(sub) -> None:
    """The ``export`` sub-command (``cmd_export``)."""
    p = sub.add_parser(
        "export", help="export a model to ONNX (dynamic batch, H and W) and check onnxruntime against eager mode",
        description="Exports with laplacianformer.models.export.export_onnx, then runs eager mode and onnxruntime "
                    "on the same random batch at the export size and at --sizes, printing per size the max abs "
                    "and relative error (max|ort - eager| / max|eager|) and the median onnxruntime time; exit "
                    "status 2 when a relative error exceeds --tolerance. Needs onnx and onnxruntime "
                    "(pip install laplacianformer[onnx]).")
    p.add_argument("--model", default="laplacianformer_tiny", help="registered model name (default laplacianformer_tiny)")
    p.add_argument("--checkpoint", "--pretrained", dest="checkpoint", metavar="PATH",
                   help="saved model directory, training run directory or weights file (hub.from_pretrained; "
                        "default: the named model's random initialisation)")
    p.add_argument("--img-size", default="224", help="export size: N or HxW pixels (default 224)")
    p.add_argument("--features-only", action="store_true",
                   help="export the backbone's four feature maps (timm features_only, as detection uses)")
    p.add_argument("--num-classes", type=positive_int, default=None, help="classifier classes (default: the model's)")
    p.add_argument("--model-kwargs", type=_json_dict, default=None,
                   help='JSON object of model overrides, e.g. \'{"depths": [1, 1, 1, 1]}\' (not with --checkpoint)')
    group = p.add_mutually_exclusive_group()
    group.add_argument("--dynamic", dest="dynamic", action="store_true", default=True,
                       help="dynamic batch, height and width (default)")
    group.add_argument("--static", dest="dynamic", action="store_false", help="fix batch, height and width")
    p.add_argument("--dynamo", action="store_true",
                   help="the dynamo (torch.export-based) exporter instead of the TorchScript one (minutes)")
    p.add_argument("--sizes", default="128x200,288x416",
                   help="other HxW sizes checked with --dynamic, comma-separated (default 128x200,288x416; "
                        "e.g. add 800x1344 for a detection size)")
    p.add_argument("--batch", type=positive_int, default=1, help="batch of the export example and the checks")
    p.add_argument("--runs", type=positive_int, default=3, help="onnxruntime calls timed per size (median)")
    p.add_argument("--tolerance", type=positive_float, default=1e-4, help="largest relative error (default 1e-4)")
    p.add_argument("--out", required=True, help="the .onnx file to write")


def _hw(flag: str, text: str) -> tuple[int, int]:
    parts = text.lower().split("x")
    values = _ints(flag, ",".join(parts))
    if len(values) not in (1, 2):
        raise UserError(f"{flag}: expected N or HxW, got {text!r}")
    return (values[0], values[-1])


def cmd_export(args) -> int:
    import time

    import torch

    from .models import create_model
    from .models.export import export_onnx, require
    from .models.export_check import check_onnx, format_checks

    try:
        require("onnx", "onnxruntime", *(["onnxscript"] if args.dynamo else []))
    except ImportError as e:
        raise UserError(f"export: {e}") from None
    size = _hw("--img-size", args.img_size)
    sizes = [size] + ([_hw("--sizes", t) for t in args.sizes.split(",") if t.strip()] if args.dynamic else [])
    kwargs = {} if args.num_classes is None else {"num_classes": args.num_classes}
    if args.model_kwargs and args.checkpoint is not None:
        raise UserError("--model-kwargs: not with --checkpoint (the checkpoint's config builds the model)")
    if args.checkpoint is not None:
        from .hub import from_pretrained

        model = from_pretrained(args.checkpoint, **kwargs)
        if args.features_only:
            from timm.models import FeatureListNet

            model = FeatureListNet(model, out_indices=(0, 1, 2, 3), flatten_sequential=True)
    else:
        kwargs.update(args.model_kwargs or {})
        model = create_model(args.model, **kwargs, **({"features_only": True} if args.features_only else {}))
    model.eval()
    in_chans = getattr(model, "in_chans", 3)
    example = torch.randn(args.batch, in_chans, *size)
    t0 = time.perf_counter()
    export_onnx(model, args.out, example, dynamic_batch=args.dynamic, dynamic_hw=args.dynamic, dynamo=args.dynamo)
    print(f"wrote {args.out} ({'dynamic' if args.dynamic else 'static'} batch/H/W, "
          f"{'dynamo' if args.dynamo else 'TorchScript'} exporter, {time.perf_counter() - t0:.1f} s)")
    rows = check_onnx(model, args.out, sizes, batch=args.batch, in_chans=in_chans, runs=args.runs,
                      tolerance=args.tolerance)
    print(format_checks(rows))
    print(f"onnxruntime within {args.tolerance:g} relative of eager mode at every size")
    return 0


def _flag_error(e: Exception) -> str:
    """'lr: expected ...' -> '--lr: expected ...' when the message starts with a TrainConfig field."""
    from .train.config import TrainConfig

    msg = str(e)
    head, sep, rest = msg.partition(":")
    if sep and head in TrainConfig.__dataclass_fields__:
        return f"--{head.replace('_', '-')}:{rest}"
    return msg


def cmd_train(args) -> int:
    from .train import TrainConfig, Trainer
    from .train.config import saved_config
    from .train.engine import read_resume

    fields = set(TrainConfig.__dataclass_fields__)
    given = {k: v for k, v in vars(args).items() if k in fields}
    resume = None
    if args.resume:
        resume = read_resume(args.resume)  # read once; the Trainer restores from it
        base = resume.state["config"]
    elif args.config:
        path = Path(args.config)
        if not path.is_file():
            raise UserError(f"--config: {path}: no such file")
        try:
            base = json.loads(path.read_text())
        except json.JSONDecodeError as e:
            raise UserError(f"--config: {path}: not valid JSON ({e.msg})") from None
        if not isinstance(base, dict) or "format" in base:
            raise UserError(f"--config: {path}: not a training configuration (a run's train_config.json)")
        base = saved_config(base)
    else:
        base = TrainConfig().to_dict()
    config = TrainConfig.from_dict({**base, **given})
    try:
        config.validate()
    except (ValueError, TypeError) as e:
        raise UserError(_flag_error(e)) from None
    if args.allow_schedule_change and resume is None:
        raise UserError("--allow-schedule-change: only applies with --resume")
    trainer = Trainer(config, resume=resume, allow_schedule_change=args.allow_schedule_change)
    del resume  # the Trainer has restored its state
    try:
        result = trainer.fit()
    finally:
        trainer.close()
    if trainer.dist.is_main:
        _print_result(result)
    if result["interrupted"]:
        signum = int(getattr(signal, result["interrupted"]))
        print(f"{PROG}: interrupted by {result['interrupted']}; checkpoint saved, continue with "
              f"`{PROG} train --resume {result['run_dir']}`", file=sys.stderr)
        return 128 + signum
    return 0


def _print_result(r: dict) -> None:
    keys = ("run_dir", "steps", "epochs_completed", "top1", "top5", "loss", "params", "images_per_s",
            "train_time_s", "peak_memory_mb")
    print(json.dumps({k: r.get(k) for k in keys}, indent=1))


def cmd_eval(args) -> int:
    from .train.evaluate_run import evaluate_checkpoint

    res = evaluate_checkpoint(args.checkpoint, data=args.data, model=args.model, test_subset=args.test_subset,
                              batch_size=args.batch_size, amp=args.amp, ema=args.ema, verify=args.verify,
                              out=args.out, device=args.device, progress=args.progress)
    print(f"top-1 {100 * res['top1']:.2f}%  top-5 {100 * res['top5']:.2f}%  loss {res['loss']:.4f}  (n={res['n']})")
    width = max(len(str(c)) for c in res["classes"])
    for c, acc in zip(res["classes"], res["per_class"]):
        print(f"  {str(c):<{width}}  {'-' if acc is None else f'{100 * acc:6.2f}%'}")
    print(f"wrote {res['json']} and {res['confusion_png']}")
    return 0


def cmd_predict(args) -> int:
    import dataclasses

    import torch

    from .train.predict import format_line, load_predictor, predict, write_csv, write_json

    if args.threads:
        torch.set_num_threads(args.threads)
    if args.retain_heap:
        from .heap import retain_freed_memory

        retain_freed_memory()  # False off glibc: the default allocator, the same predictions
    from .checkpoint import CheckpointError

    try:
        model, prep, _ = load_predictor(args.run, ema=args.ema, verify=args.verify, model_name=args.model)
    except (CheckpointError, OSError, ValueError) as e:  # from_pretrained names its arguments, not the flags
        head, sep, rest = str(e).partition(": ")
        flag = {"path": "--run", "model_or_run": "--run", "checkpoint": "--run", "model_name": "--model",
                "ema": "--ema"}.get(head)
        if not sep or flag is None:
            raise
        raise UserError(f"{flag}: {rest}") from None
    try:
        preds = predict(model, args.images, top_k=args.top_k, batch_size=args.batch_size, device=args.device,
                        progress=args.progress)
    except ValueError as e:
        head, sep, rest = str(e).partition(": ")
        raise UserError(f"--{head.replace('_', '-')}: {rest}" if head in ("device", "top_k") else str(e)) from None
    for pred in preds:
        print(format_line(pred))
    info = {"run": str(args.run), "preprocessing": dataclasses.asdict(prep), "top_k": args.top_k}
    if args.json:
        print(f"wrote {write_json(preds, args.json, **info)}", file=sys.stderr)
    if args.csv:
        print(f"wrote {write_csv(preds, args.csv)}", file=sys.stderr)
    return 0


def _ints(flag: str, text: str, count: int | None = None) -> tuple[int, ...]:
    try:
        values = tuple(int(t) for t in text.split(","))
    except ValueError:
        raise UserError(f"{flag}: expected comma-separated integers, got {text!r}") from None
    if (count is not None and len(values) != count) or min(values) < 1:
        raise UserError(f"{flag}: expected {count or 'one or more'} integers >= 1, got {text!r}")
    return values


def _print_builds() -> bool:
    """Each C library's build status, one line each; True when all are built."""
    from .ops._clib import cache_dir
    from .ops.builds import build_all

    status, ok = build_all()
    for name, text in status.items():
        print(f"C kernels {name}: {text}")
    print(f"cache: {cache_dir()}")
    return ok


def cmd_build(args) -> int:
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # the statuses say it, with every reason
        ok = _print_builds()
    if not ok:
        from .ops._clib import FALLBACK_COST

        print(f"build: a library is not built; {FALLBACK_COST}", file=sys.stderr)
    return 0 if ok else 1


def _info_dispatch(args) -> int:
    import torch

    from .ops import explain_all

    b, h, n, d = _ints("--shape", args.shape, 4)
    if args.hw is not None:
        hw = _ints("--hw", args.hw, 2)
    else:
        side = int(round(n**0.5))
        hw = (side, side) if side * side == n else None
    if args.landmarks is not None:
        landmarks = _ints("--landmarks", args.landmarks)
        landmarks = landmarks[0] if len(landmarks) == 1 else landmarks
    else:
        landmarks = (7, 7) if hw is not None else 49
    try:
        device = torch.device(args.device)
        q, k, v = (torch.randn(b, h, n, d, dtype=getattr(torch, args.dtype), device=device) for _ in range(3))
    except (RuntimeError, ValueError) as e:
        raise UserError(f"--device: {e}") from None
    try:
        print(explain_all(q, k, v, hw=hw, landmarks=landmarks, backward=args.backward))
    except (TypeError, ValueError) as e:
        raise UserError(str(e)) from None
    _print_builds()
    return 0


def cmd_info(args) -> int:
    if args.dispatch:
        return _info_dispatch(args)
    if args.model is None:
        raise UserError("info: expected MODEL (e.g. laplacianformer_tiny) or --dispatch")
    try:
        from .models import format_model_info, model_info
    except ImportError as e:
        raise UserError(f"info: the model registry is not available ({e})") from None
    try:
        print(format_model_info(model_info(args.model, img_size=args.img_size)))
    except ValueError as e:
        msg = str(e)
        raise UserError(msg if not msg.startswith("name:") else "MODEL:" + msg[5:]) from None
    return 0


def cmd_bench(args) -> int:
    from .bench import registry

    if args.list:
        for name in registry.check_names(args.names):
            print(f"{name:<20} {registry.describe(name)}")
        return 0
    return registry.run(args.names, quick=args.quick, publish=args.publish, options=getattr(args, "bench_options", []))


def cmd_demo(args) -> int:
    from .demo.run import run_demo

    run_demo(out=args.out, attns=args.attns, data=args.data, quick=args.quick, jobs=args.jobs, cost=args.cost,
             publish=args.publish, cost_sizes=args.cost_sizes, time_budget=args.time_budget, progress=args.progress,
             train_subset=args.train_subset, test_subset=args.test_subset, epochs=args.epochs, img_size=args.img_size,
             batch_size=args.batch_size, threads=args.threads, seed=args.seed, lr=args.lr,
             model_kwargs=args.model_kwargs)
    return 0


def cmd_data(args) -> int:
    from .data.scenes import run_scenes

    return run_scenes(args)


def cmd_detect(args) -> int:
    from .detection.cli import run_detect

    return run_detect(args)


def cmd_forward(name: str, rest: list[str]) -> int:
    import importlib

    try:
        mod = importlib.import_module(f"laplacianformer.experiments.{name}")
    except ModuleNotFoundError as e:
        if e.name and e.name.startswith("laplacianformer.experiments"):
            raise UserError(f"{name}: laplacianformer.experiments.{name} is not installed in this version") from None
        raise
    return int(mod.main(rest) or 0)


def _user_error_types():
    """Errors shown as one line: ours name the flag or path; ValueError/TypeError from the library start
    with the argument name; OSError names the file."""
    from .checkpoint import CheckpointError
    from .data import DataError

    return (UserError, DataError, CheckpointError, ValueError, TypeError, FloatingPointError, OSError)


def _run(argv: list[str]) -> int:
    rest = argv[1:] if argv[:1] == ["--debug"] else argv
    if rest and rest[0] in FORWARDED:
        return cmd_forward(rest[0], rest[1:])
    parser, clean = build_parser(), [a for a in argv if a != "--debug"]
    args, extra = parser.parse_known_args(clean)
    if extra:
        if args.command != "bench":
            parser.parse_args(clean)  # argparse's own one-line error for the unknown arguments
        args.bench_options = extra  # the named benchmark's own options (cmd_bench)
    handler = {"train": cmd_train, "eval": cmd_eval, "info": cmd_info, "bench": cmd_bench, "export": cmd_export,
               "demo": cmd_demo, "data": cmd_data, "detect": cmd_detect, "build": cmd_build,
               "predict": cmd_predict}[args.command]
    return handler(args)


def main(argv: list[str] | None = None) -> int:
    return run_main(PROG, argv, _run, _user_error_types(), _flag_error)


if __name__ == "__main__":
    sys.exit(main())
