"""Draw a detector's output on images: boxes, class names, scores and (Mask R-CNN) masks, as PNG (PIL).

``predict_images(model, categories, paths, out_dir, score_threshold=0.5)`` writes ``out_dir/<stem>.png``
per image and ``out_dir/predictions.json`` ({file: {"drawing": "<stem>.png", "detections": [{"category_id", "name",
"bbox" [x, y, w, h], "score"}, ...]}}); see docs/DETECTION.md.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from .coco import image_tensor, read_rgb

PALETTE = [(230, 25, 75), (60, 180, 75), (255, 225, 25), (0, 130, 200), (245, 130, 48), (145, 30, 180),
           (70, 240, 240), (240, 50, 230), (210, 245, 60), (250, 190, 212), (0, 128, 128), (170, 110, 40)]


def read_image(path: Path) -> tuple[torch.Tensor, "object"]:
    """(image (3, H, W) float in [0, 1], the PIL RGB image) of any file PIL reads (grayscale -> RGB)."""
    rgb = read_rgb(path)
    return image_tensor(rgb), rgb


def draw(rgb, output: dict, categories: list[dict], score_threshold: float):
    """A copy of the PIL image ``rgb`` with the detections of ``output`` scoring >= ``score_threshold``."""
    from PIL import Image, ImageDraw

    keep = output["scores"] >= score_threshold
    boxes = output["boxes"][keep].tolist()
    labels = output["labels"][keep].tolist()
    scores = output["scores"][keep].tolist()
    base = np.asarray(rgb, dtype=np.float32)
    if "masks" in output and keep.any():
        masks = (output["masks"][keep][:, 0] > 0.5).numpy()
        for m, lab in zip(masks, labels):
            colour = np.array(PALETTE[(lab - 1) % len(PALETTE)], dtype=np.float32)
            base[m] = 0.55 * base[m] + 0.45 * colour
    image = Image.fromarray(base.clip(0, 255).astype(np.uint8))
    pen = ImageDraw.Draw(image)
    for (x0, y0, x1, y1), lab, s in zip(boxes, labels, scores):
        colour = PALETTE[(lab - 1) % len(PALETTE)]
        pen.rectangle([x0, y0, x1, y1], outline=colour, width=max(1, round(min(image.size) / 200)))
        text = f"{categories[lab - 1]['name']} {s:.2f}"
        left, top, right, bottom = pen.textbbox((x0, y0), text)
        ty = y0 - (bottom - top) - 2 if y0 - (bottom - top) - 2 >= 0 else y0
        pen.rectangle([x0, ty, x0 + right - left + 2, ty + bottom - top + 2], fill=colour)
        pen.text((x0 + 1, ty), text, fill=(0, 0, 0))
    return image


@torch.no_grad()
def predict_images(model, categories: list[dict], paths, out_dir: str | Path, *, score_threshold: float = 0.5,
                   device="cpu") -> dict:
    """Run ``model`` (eval mode) on each image and write the drawings; returns the predictions dict."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model.eval()
    summary = {}
    used: set[str] = set()
    for p in map(Path, paths):
        image, rgb = read_image(p)
        output = {k: v.cpu() for k, v in model([image.to(device)])[0].items()}
        name = p.stem
        while name in used:  # two inputs with the same stem from different folders
            name += "_"
        used.add(name)
        draw(rgb, output, categories, score_threshold).save(out_dir / f"{name}.png")
        keep = output["scores"] >= score_threshold
        boxes = output["boxes"][keep]
        summary[str(p)] = {"drawing": f"{name}.png", "detections": [
            {"category_id": categories[lab - 1]["id"], "name": categories[lab - 1]["name"],
             "bbox": [round(v, 2) for v in (b[0], b[1], b[2] - b[0], b[3] - b[1])], "score": round(s, 4)}
            for b, lab, s in zip(boxes.tolist(), output["labels"][keep].tolist(), output["scores"][keep].tolist())
        ]}
    (out_dir / "predictions.json").write_text(json.dumps(summary, indent=1) + "\n")
    return summary
