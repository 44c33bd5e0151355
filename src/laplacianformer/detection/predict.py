"""Draw a detector's output on images: boxes, class names, scores, (Mask R-CNN) masks and a legend, as PNG (PIL).

``predict_images(model, categories, paths, out_dir, score_threshold=0.5, top_k=None, max_per_class=None)``
writes ``out_dir/<stem>.png`` per image and ``out_dir/predictions.json`` ({file: {"drawing": "<stem>.png",
"detections": [{"category_id", "name", "bbox" [x, y, w, h], "score"}, ...], "candidates", "best_score"}});
see docs/DETECTION.md. The detections kept are those scoring >= ``score_threshold``, at most
``max_per_class`` per category and ``top_k`` in all, highest scores first (``select``).

Legibility: a drawing is the image enlarged by a whole factor until its shorter side is at least
``MIN_SIDE`` px (nearest neighbour: the pixels the model saw), with font and line sizes proportional to that
side, labels in black or white by the brightness of their class colour, and a legend strip on the right
(each class drawn: colour, name, count, best score; the filter and how many detections it kept).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import torch

from ..train.progress import ProgressLine, progress_mode
from .coco import image_tensor, read_rgb

PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]
MIN_SIDE = 512  # drawings of smaller images are enlarged to at least this shorter side
LEGEND_BACKGROUND = (255, 255, 255)


def read_image(path: Path) -> tuple[torch.Tensor, "object"]:
    """(image (3, H, W) float in [0, 1], the PIL RGB image) of any file PIL reads (grayscale -> RGB)."""
    rgb = read_rgb(path)
    return image_tensor(rgb), rgb


def select(output: dict, score_threshold: float, top_k: int | None = None,
           max_per_class: int | None = None) -> torch.Tensor:
    """Indices into ``output`` (torchvision: ``boxes``, ``labels``, ``scores``) of the detections kept,
    highest score first: score >= ``score_threshold``, at most ``max_per_class`` per label, ``top_k`` in all."""
    for name, v in (("top_k", top_k), ("max_per_class", max_per_class)):
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{name}: expected an integer >= 1 or None, got {v!r}")
    scores = output["scores"].detach().float().cpu()
    order = torch.argsort(scores, descending=True, stable=True)
    order = order[scores[order] >= score_threshold]
    if max_per_class is not None:
        labels = output["labels"].detach().cpu()[order].tolist()
        seen: dict[int, int] = {}
        keep = []
        for i, lab in zip(order.tolist(), labels):
            seen[lab] = seen.get(lab, 0) + 1
            if seen[lab] <= max_per_class:
                keep.append(i)
        order = torch.tensor(keep, dtype=torch.long)
    return order[:top_k] if top_k is not None else order


def colour_of(label: int) -> tuple[int, int, int]:
    return PALETTE[(label - 1) % len(PALETTE)]


def text_colour(fill: tuple[int, int, int]) -> tuple[int, int, int]:
    """Black on light fills, white on dark ones (ITU-R BT.601 luma)."""
    r, g, b = fill
    return (0, 0, 0) if 0.299 * r + 0.587 * g + 0.114 * b >= 140 else (255, 255, 255)


def drawing_scale(width: int, height: int) -> int:
    """The whole factor that brings the shorter side to at least ``MIN_SIDE`` px (1 for large images)."""
    return max(1, math.ceil(MIN_SIDE / max(1, min(width, height))))


def _font(px: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=px)
    except TypeError:  # Pillow < 10.1: the fixed bitmap font
        return ImageFont.load_default()


def draw(rgb, output: dict, categories: list[dict], keep: torch.Tensor, *, note: str = ""):
    """The drawing of the detections ``keep`` (indices, ``select``) of ``output`` on the PIL image ``rgb``:
    masks blended at the image's size, then the enlarged image (``drawing_scale``) with boxes, labels
    ``name score`` and the legend strip (``note``: its last line, e.g. the filter)."""
    from PIL import Image, ImageDraw

    keep = keep.long()
    boxes = output["boxes"].detach().float().cpu()[keep].tolist()
    labels = output["labels"].detach().cpu()[keep].tolist()
    scores = output["scores"].detach().float().cpu()[keep].tolist()
    base = np.asarray(rgb, dtype=np.float32).copy()
    if "masks" in output and len(labels):
        masks = (output["masks"].detach().cpu()[keep][:, 0] > 0.5).numpy()
        for m, lab in zip(masks[::-1], labels[::-1]):  # the best detection's mask on top
            base[m] = 0.55 * base[m] + 0.45 * np.array(colour_of(lab), dtype=np.float32)
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    scale = drawing_scale(*image.size)
    if scale > 1:
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    side = min(image.size)
    font = _font(max(12, round(side / 40)))
    line = max(2, round(side / 250))
    pen = ImageDraw.Draw(image)
    for (x0, y0, x1, y1), lab, s in reversed(list(zip(boxes, labels, scores))):  # the best drawn last, on top
        x0, y0, x1, y1 = (v * scale for v in (x0, y0, x1, y1))
        colour = colour_of(lab)
        pen.rectangle([x0, y0, x1, y1], outline=colour, width=line)
        text = f"{categories[lab - 1]['name']} {s:.2f}"
        left, top, right, bottom = pen.textbbox((0, 0), text, font=font)
        w, h = right - left + 2 * line, bottom - top + line
        ty = y0 - h if y0 - h >= 0 else y0
        tx = min(max(0.0, x0), max(0.0, image.width - w))
        pen.rectangle([tx, ty, tx + w, ty + h], fill=colour)
        pen.text((tx + line - left, ty + line // 2 - top), text, fill=text_colour(colour), font=font)
    return _with_legend(image, labels, scores, categories, font, note)


def _with_legend(image, labels: list[int], scores: list[float], categories: list[dict], font, note: str):
    """``image`` with a strip on its right: per class drawn, a colour swatch, its name, count and best score;
    then ``note``."""
    from PIL import Image, ImageDraw

    rows: list[tuple[tuple[int, int, int] | None, str]] = []
    by_class: dict[int, list[float]] = {}
    for lab, s in zip(labels, scores):
        by_class.setdefault(lab, []).append(s)
    for lab, mine in sorted(by_class.items(), key=lambda item: -max(item[1])):
        rows.append((colour_of(lab), f"{categories[lab - 1]['name']}  x{len(mine)}  best {max(mine):.2f}"))
    rows += [(None, text) for text in note.splitlines() if text]
    probe = ImageDraw.Draw(image)
    boxes = [probe.textbbox((0, 0), text, font=font) for _, text in rows]
    row_h = max((b[3] - b[1] for b in boxes), default=10) + 8
    swatch = row_h - 8
    width = max((b[2] - b[0] for b in boxes), default=0) + swatch + 24
    height = max(image.height, row_h * len(rows) + 12)
    canvas = Image.new("RGB", (image.width + width, height), LEGEND_BACKGROUND)
    canvas.paste(image, (0, 0))
    pen = ImageDraw.Draw(canvas)
    x, y = image.width + 8, 6
    for (colour, text), (left, top, _, _) in zip(rows, boxes):
        tx = x
        if colour is not None:
            pen.rectangle([x, y + 4, x + swatch, y + 4 + swatch], fill=colour, outline=(0, 0, 0))
            tx = x + swatch + 8
        pen.text((tx - left, y + 4 - top), text, fill=(0, 0, 0), font=font)
        y += row_h
    return canvas


def filter_note(n_shown: int, n_total: int, score_threshold: float, top_k: int | None,
                max_per_class: int | None, best: float | None) -> str:
    """The legend's last lines: how many of the detector's detections are drawn, and by which filter."""
    rule = [f"score >= {score_threshold:g}"]
    if top_k is not None:
        rule.append(f"top {top_k}")
    if max_per_class is not None:
        rule.append(f"<= {max_per_class} per class")
    best_text = "" if best is None else f" (best score {best:.2f})"
    return f"{n_shown} of {n_total} detections{best_text}\n" + ", ".join(rule)


@torch.no_grad()
def predict_images(model, categories: list[dict], paths, out_dir: str | Path, *, score_threshold: float = 0.5,
                   top_k: int | None = None, max_per_class: int | None = None, device="cpu",
                   progress: bool | str = False) -> dict:
    """Run ``model`` (eval mode) on each image and write the drawings; returns the predictions dict.

    ``progress``: True -> a line at least every 30 s on stderr when it is not a terminal (``"lines"``:
    always), False -> nothing."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    summary = {}
    used: set[str] = set()
    paths = [Path(p) for p in paths]
    timed = ProgressLine("detect predict", len(paths), unit="image", enabled=progress_mode(progress) == "lines")
    for p in paths:
        image, rgb = read_image(p)
        output = {k: v.cpu() for k, v in model([image.to(device)])[0].items()}
        keep = select(output, score_threshold, top_k, max_per_class)
        name = p.stem
        while name in used:  # two inputs with the same stem from different folders
            name += "_"
        used.add(name)
        n_total = len(output["scores"])
        best = float(output["scores"].max()) if n_total else None
        note = filter_note(len(keep), n_total, score_threshold, top_k, max_per_class, best)
        draw(rgb, output, categories, keep, note=note).save(out_dir / f"{name}.png")
        boxes, labels, scores = (output[k][keep].tolist() for k in ("boxes", "labels", "scores"))
        summary[str(p)] = {"drawing": f"{name}.png", "candidates": n_total,
                           "best_score": None if best is None else round(best, 4), "detections": [
            {"category_id": categories[lab - 1]["id"], "name": categories[lab - 1]["name"],
             "bbox": [round(v, 2) for v in (b[0], b[1], b[2] - b[0], b[3] - b[1])], "score": round(s, 4)}
            for b, lab, s in zip(boxes, labels, scores)
        ]}
        timed.update(images=1)
    (out_dir / "predictions.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
