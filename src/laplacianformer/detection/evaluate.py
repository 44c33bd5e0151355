"""COCO metrics through pycocotools ``COCOeval`` (bbox, segm), with pycocotools' prints captured.

    metrics = coco_metrics(coco_set, results, iou_types=("bbox", "segm"))
    metrics["bbox"]["AP50"]    # float in [0, 1], or None where COCOeval reports -1 (no ground truth there)

``results`` is a standard COCO results list: ``{"image_id", "category_id", "bbox": [x, y, w, h], "score"
[, "segmentation": RLE]}``; ``validate_results`` checks it against the ground truth first, so a bad file
stops with a message naming the file and the entry index, never a traceback from pycocotools.
``predict_results`` runs a torchvision detector over a ``CocoDetection`` (the rank's shard under DDP,
gathered with ``all_gather_object``). See docs/DETECTION.md (metrics JSON).
"""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import torch

from .coco import AnnotationError, CocoDetection, CocoSet

__all__ = ["METRIC_KEYS", "TABLE_KEYS", "coco_metrics", "validate_results", "predict_results", "format_table",
           "detections_to_results"]

METRIC_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR1", "AR10", "AR100", "ARs", "ARm", "ARl")
"""COCOeval.stats in order (maxDets 100 for every AP; AR at 1/10/100 detections and by area at 100)."""
TABLE_KEYS = ("AP", "AP50", "AP75", "APs", "APm", "APl", "AR100")


def _quiet():
    """Capture pycocotools' prints (returned as text by the caller when asked)."""
    return contextlib.redirect_stdout(io.StringIO())


def _coco_gt(coco: CocoSet):
    from pycocotools.coco import COCO

    gt = COCO()
    gt.dataset = coco.data
    with _quiet():
        gt.createIndex()
    return gt


def validate_results(results, coco: CocoSet, where: str = "results") -> list[dict]:
    """Check a COCO results list against ``coco``; raises ``AnnotationError`` naming ``where`` and the index."""
    if not isinstance(results, list):
        raise AnnotationError(f"{where}: expected a JSON list of detections, got {type(results).__name__}")
    sizes = {img["id"]: (img["height"], img["width"]) for img in coco.images}
    cats = set(coco.category_ids)
    with_seg = None
    for i, r in enumerate(results):
        at = f"{where}: entry {i}"
        if not isinstance(r, dict):
            raise AnnotationError(f"{at}: expected an object, got {type(r).__name__}")
        if r.get("image_id") not in sizes:
            raise AnnotationError(f"{at}: image_id {r.get('image_id')!r} is not in the ground truth {coco.path}")
        if r.get("category_id") not in cats:
            raise AnnotationError(f"{at}: unknown category_id {r.get('category_id')!r} (categories of {coco.path}: {sorted(cats)})")
        score = r.get("score")
        if not isinstance(score, (int, float)) or isinstance(score, bool) or not math.isfinite(score):
            raise AnnotationError(f"{at}: score must be a finite number, got {score!r}")
        box = r.get("bbox")
        if not (isinstance(box, list) and len(box) == 4
                and all(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) for v in box)):
            raise AnnotationError(f"{at}: bbox must be [x, y, width, height] (4 finite numbers), got {box!r}")
        if box[2] < 0 or box[3] < 0:
            raise AnnotationError(f"{at}: bbox {box} has a negative width or height")
        seg = r.get("segmentation")
        if with_seg is None:
            with_seg = seg is not None
        elif with_seg != (seg is not None):
            raise AnnotationError(f"{at}: some entries have a segmentation and others not (all or none)")
        if seg is not None:
            h, w = sizes[r["image_id"]]
            if not (isinstance(seg, dict) and isinstance(seg.get("counts"), str) and seg.get("size") == [h, w]):
                raise AnnotationError(f"{at}: segmentation must be a compressed RLE {{'size': [{h}, {w}], 'counts': str}}")
    return results


def _run_cocoeval(gt, dt, iou_type: str) -> dict:
    from pycocotools.cocoeval import COCOeval

    ev = COCOeval(gt, dt, iouType=iou_type)
    with _quiet():
        ev.evaluate()
        ev.accumulate()
        ev.summarize()
    return {k: (None if v < 0 else float(v)) for k, v in zip(METRIC_KEYS, ev.stats)}


def coco_metrics(coco: CocoSet, results: list[dict], iou_types=("bbox",), *, where: str = "results") -> dict:
    """{"bbox": {AP, AP50, ...}, ["segm": {...}], "images", "annotations", "detections"} for ``results``.

    An empty ``results`` list scores 0 wherever the ground truth has objects. Metric values are floats in
    [0, 1]; None where COCOeval reports -1 (e.g. APl when no object is large)."""
    from pycocotools.coco import COCO

    validate_results(results, coco, where)
    if "segm" in iou_types and results and "segmentation" not in results[0]:
        raise AnnotationError(f"{where}: segm evaluation needs a 'segmentation' in every entry")
    gt = _coco_gt(coco)
    if results:
        with _quiet():
            dt = gt.loadRes([dict(r) for r in results])
    else:
        dt = COCO()
        dt.dataset = {"images": coco.images, "categories": coco.categories, "annotations": []}
        with _quiet():
            dt.createIndex()
    out = {t: _run_cocoeval(gt, dt, t) for t in iou_types}
    out.update(images=len(coco.images), annotations=len(coco.data["annotations"]), detections=len(results))
    return out


def format_table(metrics: dict, keys=TABLE_KEYS) -> str:
    """A fixed-width table: one row per IoU type present in ``metrics``; '-' for None."""
    rows = [f"{'':6}" + "".join(f"{k:>8}" for k in keys)]
    for t in ("bbox", "segm"):
        if t in metrics:
            rows.append(f"{t:6}" + "".join(f"{'-' if metrics[t][k] is None else format(metrics[t][k], '.3f'):>8}" for k in keys))
    return "\n".join(rows)


def detections_to_results(output: dict, image_id: int, category_ids: list[int], *, masks: bool) -> list[dict]:
    """One torchvision detector output (boxes xyxy, labels 1..K, scores[, masks (N, 1, H, W) probs]) as COCO results."""
    boxes = output["boxes"].detach().float().cpu()
    scores = output["scores"].detach().float().cpu().tolist()
    labels = output["labels"].detach().cpu().tolist()
    xywh = torch.cat([boxes[:, :2], boxes[:, 2:] - boxes[:, :2]], 1).tolist()
    res = [{"image_id": image_id, "category_id": category_ids[lab - 1], "bbox": [round(v, 3) for v in b],
            "score": round(s, 5)} for b, lab, s in zip(xywh, labels, scores)]
    if masks and res:
        from pycocotools import mask as mask_utils

        binary = (output["masks"][:, 0] > 0.5).cpu().numpy().astype(np.uint8)
        rles = mask_utils.encode(np.asfortranarray(binary.transpose(1, 2, 0)))
        for r, rle in zip(res, rles):
            r["segmentation"] = {"size": [int(v) for v in rle["size"]], "counts": rle["counts"].decode("ascii")}
    return res


@torch.no_grad()
def predict_results(model, dataset: CocoDetection, *, batch_size: int = 4, device="cpu", amp_context=None,
                    rank: int = 0, world_size: int = 1, progress: bool = False, desc: str = "eval") -> list[dict]:
    """COCO results of ``model`` (eval mode) on ``dataset``: images rank, rank + world_size, ... of it, then
    gathered from every rank (``all_gather_object``) so each rank returns the whole list, ordered by image."""
    was_training = model.training
    model.eval()
    indices = list(range(rank, len(dataset), world_size))
    masks = getattr(dataset, "masks", False)
    cat_ids = dataset.coco.category_ids
    results: list[dict] = []
    bar = None
    if progress:
        from tqdm import tqdm

        bar = tqdm(total=len(indices), desc=desc, leave=False, dynamic_ncols=True)
    for start in range(0, len(indices), batch_size):
        batch = [dataset.load_image(i) for i in indices[start:start + batch_size]]
        ids = [dataset.coco.images[i]["id"] for i in indices[start:start + batch_size]]
        with amp_context() if amp_context else contextlib.nullcontext():
            outputs = model([im.to(device) for im in batch])
        for out, image_id in zip(outputs, ids):
            results.extend(detections_to_results(out, image_id, cat_ids, masks=masks))
        if bar is not None:
            bar.update(len(batch))
    if bar is not None:
        bar.close()
    model.train(was_training)
    if world_size > 1:
        import torch.distributed as dist

        parts = [None] * world_size
        dist.all_gather_object(parts, results)
        order = {img["id"]: k for k, img in enumerate(dataset.coco.images)}
        results = sorted((r for p in parts for r in p), key=lambda r: (order[r["image_id"]], -r["score"]))
    return results


def load_results(path: str | Path):
    """A COCO results JSON file (a list), with clear errors for missing / invalid / truncated files."""
    from .coco import _read_json

    return _read_json(Path(path))
