"""``laplacianformer detect {train,eval,predict}`` (docs/DETECTION.md).

    add_detect_parser(subparsers)      # adds "detect" to a parent CLI; args.handler(args) runs it
    python -m laplacianformer.detection train --data DIR --detector retinanet --out RUN ...

User errors (bad flags, malformed annotations, unreadable runs) print one line naming the flag, file and
entry and exit with status 2; an interrupted training (SIGINT/SIGTERM) checkpoints and exits with
128 + the signal number; ``--resume`` continues it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from ..cmdline import json_object, nonneg_float, nonneg_int, positive_float, positive_int, run_main

PROG = "laplacianformer detect"


_json_object = json_object('{"attn": "gaussian"}')


def _add_train(sub) -> None:
    from .builders import DETECTORS
    from ..train.config import AMP_MODES

    S = argparse.SUPPRESS
    p = sub.add_parser("train", help="train RetinaNet / Mask R-CNN on a COCO-layout folder (DDP under torchrun)",
                       description="Train a torchvision detector with a LaplacianFormer (or ResNet) FPN backbone. "
                                   "Settings not given keep their defaults, or the run's values with --resume.")
    p.add_argument("--out", required=True, help="run directory (created; holds train_config.json, checkpoints, plots)")
    p.add_argument("--resume", action="store_true", help="continue the run in --out from its checkpoint")
    p.add_argument("--data", default=S, help="folder in the COCO layout: annotations/instances_<split>.json, <split>/")
    p.add_argument("--detector", choices=DETECTORS, default=S, help="retinanet (default) or maskrcnn")
    p.add_argument("--backbone", default=S, help="laplacianformer_<size> (default laplacianformer_tiny) or resnet18")
    p.add_argument("--backbone-kwargs", type=_json_object, default=S,
                   help='JSON object for create_model, e.g. \'{"attn": "gaussian"}\' or \'{"attn": "softmax"}\'')
    p.add_argument("--detector-kwargs", type=_json_object, default=S,
                   help='JSON object for torchvision RetinaNet/MaskRCNN, e.g. \'{"box_batch_size_per_image": 128}\'')
    p.add_argument("--img-size", type=positive_int, default=S, help="long image side after resizing (default 256)")
    p.add_argument("--fpn-channels", type=positive_int, default=S, help="FPN width (default 256)")
    p.add_argument("--epochs", type=positive_int, default=S, help="default 12")
    p.add_argument("--max-steps", type=positive_int, default=S, help="stop after K optimiser steps (the schedule ends there)")
    p.add_argument("--batch-size", type=positive_int, default=S, help="images per step and rank (default 8)")
    p.add_argument("--eval-batch-size", type=positive_int, default=S)
    p.add_argument("--lr", type=positive_float, default=S, help="peak AdamW learning rate (default 2e-4)")
    p.add_argument("--min-lr", type=nonneg_float, default=S)
    p.add_argument("--weight-decay", type=nonneg_float, default=S)
    p.add_argument("--warmup-steps", type=nonneg_int, default=S, help="linear warm-up (default 100, at most half the run)")
    p.add_argument("--clip-grad", type=positive_float, default=S, help="clip the gradient norm (default off)")
    p.add_argument("--score-thresh", type=nonneg_float, default=S,
                   help="keep detections scoring at least this for evaluation (default 0.05, torchvision's)")
    p.add_argument("--hflip", action=argparse.BooleanOptionalAction, default=S, help="random horizontal flips (default on)")
    p.add_argument("--amp", choices=AMP_MODES, default=S)
    p.add_argument("--seed", type=int, default=S)
    p.add_argument("--train-split", default=S, help="default train (real COCO: train2017)")
    p.add_argument("--val-split", default=S, help="default val (real COCO: val2017)")
    p.add_argument("--train-subset", type=positive_int, default=S, help="first N training images only")
    p.add_argument("--val-subset", type=positive_int, default=S, help="first N val images only")
    p.add_argument("--eval-every", type=nonneg_int, default=S, help="evaluate every N epochs (0: never; default 1)")
    p.add_argument("--save-every-steps", type=positive_int, default=S, help="also checkpoint every N steps")
    p.add_argument("--workers", type=nonneg_int, default=S, help="DataLoader worker processes (default 0)")
    p.add_argument("--threads", type=positive_int, default=S, help="torch.set_num_threads")
    p.add_argument("--device", default=S, help="auto (default), cpu, cuda")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=S,
                   help="tqdm bars on a terminal (default on); a line per epoch is always printed")
    p.set_defaults(handler=cmd_train)


def _add_eval(sub) -> None:
    p = sub.add_parser("eval", help="COCO metrics of a run, or of a COCO results file",
                       description="COCO bbox (and segm) metrics through pycocotools COCOeval: either of a trained "
                                   "run on a split (--run), or of a results file against annotations (no model).")
    p.add_argument("--run", help="run directory of 'detect train'")
    p.add_argument("--data", help="COCO-layout folder (default: the run's --data)")
    p.add_argument("--split", help="split to evaluate (default: the run's val split)")
    p.add_argument("--subset", type=positive_int, help="first N images of the split only")
    p.add_argument("--predictions", help="a COCO results JSON (image_id, category_id, bbox, score[, segmentation])")
    p.add_argument("--annotations", help="the instances JSON the predictions refer to")
    p.add_argument("--json", help="write the metrics here (default with --run: RUN/eval_<split>.json)")
    p.add_argument("--save-results", help="with --run: also write the detections as a COCO results JSON")
    p.add_argument("--batch-size", type=positive_int, default=4)
    p.add_argument("--threads", type=positive_int)
    p.add_argument("--device", default="auto")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True)
    p.set_defaults(handler=cmd_eval)


def _add_predict(sub) -> None:
    p = sub.add_parser("predict", help="draw a run's detections on images (PNG)",
                       description="Run a trained detector on image files and write PNGs with boxes, class names, "
                                   "scores, masks and a legend drawn, plus predictions.json. The detections drawn "
                                   "score at least --score-threshold, at most --max-per-class per class and "
                                   "--top-k in all, highest first; images under 512 px are enlarged for drawing.")
    p.add_argument("--run", required=True, help="run directory of 'detect train'")
    p.add_argument("images", nargs="+", metavar="IMAGE", help="image files (any mode PIL reads; grayscale -> RGB)")
    p.add_argument("--out", required=True, help="output directory for <stem>.png and predictions.json")
    p.add_argument("--score-threshold", type=nonneg_float, default=0.5,
                   help="draw detections scoring at least this (default 0.5)")
    p.add_argument("--top-k", type=positive_int, default=None,
                   help="at most K detections per image, the highest scores (default: all above the threshold)")
    p.add_argument("--max-per-class", type=positive_int, default=None,
                   help="at most M detections of each class per image (default: no limit)")
    p.add_argument("--threads", type=positive_int)
    p.add_argument("--device", default="auto")
    p.set_defaults(handler=cmd_predict)


def add_detect_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``detect`` with ``train``/``eval``/``predict`` to ``subparsers``; each sets ``args.handler``."""
    p = subparsers.add_parser("detect", help="object detection / instance segmentation (COCO layout)",
                              description="Detection with LaplacianFormer backbones: train, eval, predict (docs/DETECTION.md).")
    sub = p.add_subparsers(dest="detect_command", required=True, metavar="{train,eval,predict}")
    _add_train(sub)
    _add_eval(sub)
    _add_predict(sub)
    return p


def run_detect(args: argparse.Namespace) -> int:
    """Run the parsed ``detect`` command (what a parent CLI calls)."""
    return args.handler(args)


# ----------------------------------------------------------------------------------------------------
# handlers
# ----------------------------------------------------------------------------------------------------


def _given(args: argparse.Namespace) -> dict:
    """Settings given on the command line (argparse.SUPPRESS leaves the others out), as DetectConfig keys."""
    from .engine import DetectConfig

    names = {f for f in DetectConfig.__dataclass_fields__}
    return {k: v for k, v in vars(args).items() if k in names}


def cmd_train(args: argparse.Namespace) -> int:
    from ..hub import CHECKPOINT_NAME, TRAIN_CONFIG_NAME
    from .engine import RESUME_MAY_CHANGE, DetectConfig, train_detector

    out = Path(args.out)
    given = _given(args)
    if args.resume:
        if not (out / CHECKPOINT_NAME).exists():
            raise ValueError(f"--resume: {out / CHECKPOINT_NAME} does not exist (nothing to resume; drop --resume)")
        config = DetectConfig.load(out / TRAIN_CONFIG_NAME)
        changed = sorted(k for k, v in given.items() if getattr(config, k) != v and k not in RESUME_MAY_CHANGE)
        if changed:
            flags = ", ".join(f"--{k.replace('_', '-')}" for k in changed)
            raise ValueError(f"--resume: {flags} differ from the run's {out / TRAIN_CONFIG_NAME}; a resumed run keeps its "
                             f"settings (only {', '.join('--' + k.replace('_', '-') for k in RESUME_MAY_CHANGE)} may change)")
        for k in RESUME_MAY_CHANGE:
            if k in given:
                setattr(config, k, given[k])
    else:
        if (out / CHECKPOINT_NAME).exists():
            raise ValueError(f"--out: {out} already holds a run; pass --resume to continue it or choose another --out")
        config = DetectConfig(**given)
    result = train_detector(config, out, resume=args.resume)
    if result["rank"] != 0:
        return 128 + int(getattr(signal.Signals, result["interrupted"])) if result["interrupted"] else 0
    if result["interrupted"]:
        print(f"{PROG}: interrupted by {result['interrupted']} at step {result['steps']}; checkpoint saved, "
              f"continue with --resume --out {out}", file=sys.stderr)
        return 128 + int(getattr(signal.Signals, result["interrupted"]))
    if result["metrics"] is not None:
        from .evaluate import format_table

        print(format_table(result["metrics"]))
    return 0


def _write_json(path: str | Path, obj: dict) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=1) + "\n")
    return path


def cmd_eval(args: argparse.Namespace) -> int:
    from .coco import load_coco, split_paths
    from .evaluate import coco_metrics, format_table, load_results

    if args.run and (args.predictions or args.annotations):
        raise ValueError("--run: give either --run or --predictions with --annotations, not both")
    if not args.run:
        if not (args.predictions and args.annotations):
            raise ValueError("--predictions/--annotations: both are needed to evaluate a results file (or give --run)")
        coco = load_coco(args.annotations, check_files=False)
        results = load_results(args.predictions)
        iou = ("bbox", "segm") if isinstance(results, list) and results and isinstance(results[0], dict) \
            and "segmentation" in results[0] else ("bbox",)
        metrics = coco_metrics(coco, results, iou, where=str(args.predictions))
        metrics.update(predictions=str(args.predictions), annotations=str(args.annotations))
        print(format_table(metrics))
        if args.json:
            print(f"metrics: {_write_json(args.json, metrics)}")
        return 0

    import torch

    from .coco import CocoDetection
    from .engine import load_run, resolve_device, torch_threads
    from .evaluate import predict_results

    with torch_threads(args.threads):
        device = resolve_device(args.device)
        model, config, categories = load_run(args.run, device=device)
        data = args.data or config.data
        split = args.split or config.val_split
        coco = load_coco(*split_paths(data, split)).subset(args.subset)
        if [c["id"] for c in coco.categories] != [c["id"] for c in categories]:
            raise ValueError(f"--data: the categories of {coco.path} differ from the run's {[c['id'] for c in categories]}")
        masks = config.detector == "maskrcnn"
        dataset = CocoDetection(coco, masks=masks)
        progress = args.progress and sys.stderr.isatty()
        with torch.no_grad():
            results = predict_results(model, dataset, batch_size=args.batch_size, device=device, progress=progress)
        metrics = coco_metrics(coco, results, ("bbox", "segm") if masks else ("bbox",))
    metrics.update(run=str(args.run), data=str(data), split=split, subset=args.subset)
    print(format_table(metrics))
    path = _write_json(args.json or Path(args.run) / f"eval_{split}.json", metrics)
    print(f"metrics: {path}")
    if args.save_results:
        print(f"results: {_write_json(args.save_results, results)}")
    return 0


def cmd_predict(args: argparse.Namespace) -> int:
    from .engine import load_run, resolve_device, torch_threads
    from .predict import predict_images

    with torch_threads(args.threads):
        device = resolve_device(args.device)
        model, _, categories = load_run(args.run, device=device)
        summary = predict_images(model, categories, args.images, args.out, score_threshold=args.score_threshold,
                                 top_k=args.top_k, max_per_class=args.max_per_class, device=device, progress=True)
    for file, entry in summary.items():
        best = "" if entry["best_score"] is None else f", best score {entry['best_score']:.2f}"
        print(f"{file}: {len(entry['detections'])} of {entry['candidates']} detections drawn{best} -> "
              f"{Path(args.out) / entry['drawing']}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """A stand-alone parser whose only command is ``detect`` (for ``python -m laplacianformer.detection``)."""
    parser = argparse.ArgumentParser(prog="laplacianformer", description="LaplacianFormer detection commands.")
    parser.add_argument("--debug", action="store_true", help="show tracebacks for errors")
    sub = parser.add_subparsers(dest="command", required=True)
    add_detect_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """``python -m laplacianformer.detection {train,eval,predict} ...`` (same as ``laplacianformer detect ...``)."""
    from ..checkpoint import CheckpointError

    def run(argv: list[str]) -> int:
        return run_detect(build_parser().parse_args(["detect", *(a for a in argv if a != "--debug")]))

    return run_main(PROG, argv, run, (CheckpointError, ValueError, TypeError, OSError, FloatingPointError))
