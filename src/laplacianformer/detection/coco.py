"""COCO-layout data: a validating annotations loader and a torch ``Dataset`` for torchvision detectors.

    coco = load_coco("DIR/annotations/instances_val.json", "DIR/val")   # raises AnnotationError
    ds = CocoDetection(coco, masks=True)                                 # ds[i] -> (image, target)

Layout (docs/DETECTION.md): ``DIR/annotations/instances_<split>.json`` and the images under
``DIR/<split>/`` (``split_paths``); real COCO (``--train-split train2017``) and a user's export read the
same way. Every problem in the annotations (missing ``images``/``annotations``/``categories``, duplicate
ids, a box outside its image or with zero area, an unknown category, an annotation of a missing image, an
image file missing on disk, invalid or truncated JSON, a malformed segmentation) raises ``AnnotationError``
naming the file and the offending entry id, before anything reaches pycocotools or torchvision. Images
without annotations are valid. Missing ``area`` / ``iscrowd`` are filled (mask or box area, 0).

Targets: ``boxes`` (N, 4) float32 xyxy in pixels of the stored image, ``labels`` (N,) int64 contiguous
1..K in the order of the sorted category ids (0 is background), ``masks`` (N, H, W) uint8 when asked,
``image_id``. Crowd annotations (``iscrowd`` 1) are left out of the training targets and kept for COCOeval.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from ..data.errors import DataError

__all__ = ["AnnotationError", "CocoSet", "CocoDetection", "load_coco", "split_paths", "collate", "BOX_TOLERANCE"]

BOX_TOLERANCE = 1.0
"""Pixels a box may extend past its image border (rounding in exported files); boxes are clipped to it."""


class AnnotationError(DataError):
    """An unusable annotations file or image; the message starts with the file and names the entry id."""


def split_paths(data_dir: str | Path, split: str) -> tuple[Path, Path]:
    """(``DIR/annotations/instances_<split>.json``, ``DIR/<split>``) with a clear error when either is missing."""
    root = Path(data_dir)
    if not root.is_dir():
        raise AnnotationError(f"--data: {root}: no such directory (expected the COCO layout, docs/DETECTION.md)")
    ann = root / "annotations" / f"instances_{split}.json"
    images = root / split
    if not ann.is_file():
        raise AnnotationError(f"{ann}: no such file (split {split!r} of {root}: expected annotations/instances_{split}.json)")
    if not images.is_dir():
        raise AnnotationError(f"{images}: no such directory (images of split {split!r}, named by file_name in {ann.name})")
    return ann, images


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _int_id(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclass
class CocoSet:
    """A validated COCO file. ``data`` is the COCO dict with ``area``/``iscrowd`` filled (what COCOeval reads)."""

    path: Path
    image_dir: Path | None
    data: dict
    images: list[dict] = field(init=False)
    categories: list[dict] = field(init=False)
    anns_by_image: dict[int, list[dict]] = field(init=False)

    def __post_init__(self) -> None:
        self.images = list(self.data["images"])
        self.categories = sorted(self.data["categories"], key=lambda c: c["id"])
        self.anns_by_image = {img["id"]: [] for img in self.images}
        for ann in self.data["annotations"]:
            self.anns_by_image[ann["image_id"]].append(ann)

    @property
    def category_ids(self) -> list[int]:
        """COCO category id of label 1..K (index label - 1)."""
        return [c["id"] for c in self.categories]

    @property
    def class_names(self) -> list[str]:
        return [str(c.get("name", c["id"])) for c in self.categories]

    def subset(self, n: int | None) -> "CocoSet":
        """The first ``n`` images in file order with their annotations (all when ``n`` is None)."""
        if n is None or n >= len(self.images):
            return self
        keep = self.images[:n]
        ids = {img["id"] for img in keep}
        data = dict(self.data, images=keep, annotations=[a for a in self.data["annotations"] if a["image_id"] in ids])
        return CocoSet(self.path, self.image_dir, data)

    def require_masks(self) -> None:
        """Mask R-CNN needs a segmentation on every non-crowd annotation."""
        for ann in self.data["annotations"]:
            if not ann.get("iscrowd") and not ann.get("segmentation"):
                raise AnnotationError(f"{self.path}: annotation id {ann['id']}: no segmentation (Mask R-CNN needs masks)")


def _read_json(path: Path):
    if not path.is_file():
        raise AnnotationError(f"{path}: no such file")
    text = path.read_bytes()
    if not text.strip():
        raise AnnotationError(f"{path}: empty file")
    try:
        return json.loads(text)
    except UnicodeDecodeError as e:
        raise AnnotationError(f"{path}: not UTF-8 text ({e.reason} at byte {e.start})") from None
    except json.JSONDecodeError as e:
        end = " (truncated?)" if e.pos >= len(text.rstrip()) - 1 else ""
        raise AnnotationError(f"{path}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}{end}") from None


def _check_segmentation(where: str, seg, h: int, w: int) -> None:
    if isinstance(seg, list):
        if not seg:
            return
        for poly in seg:
            if not isinstance(poly, list) or len(poly) < 6 or len(poly) % 2 or not all(_number(v) for v in poly):
                raise AnnotationError(f"{where}: segmentation: a polygon must be a flat list of >= 3 x, y pairs of numbers")
        return
    if isinstance(seg, dict):
        size, counts = seg.get("size"), seg.get("counts")
        if not (isinstance(size, list) and len(size) == 2 and size == [h, w]):
            raise AnnotationError(f"{where}: segmentation: RLE size {size!r} is not the image's [height, width] {[h, w]}")
        if isinstance(counts, str):
            return
        if isinstance(counts, list) and all(_int_id(c) and c >= 0 for c in counts) and sum(counts) == h * w:
            return
        raise AnnotationError(f"{where}: segmentation: RLE counts must be a string or non-negative integers summing to height x width")
    raise AnnotationError(f"{where}: segmentation: expected a list of polygons or an RLE object, got {type(seg).__name__}")


def _entries(data: dict, key: str, path: Path, what: str):
    """(where, entry) for each entry of the list ``data[key]``, checked to be an object with an integer 'id'
    not seen before; ``where`` ('<path>: <what> id <id>') starts the entry's error messages."""
    seen: set[int] = set()
    for i, entry in enumerate(data[key]):
        if not isinstance(entry, dict) or not _int_id(entry.get("id")):
            raise AnnotationError(f"{path}: {key}[{i}]: expected an object with an integer 'id'")
        where = f"{path}: {what} id {entry['id']}"
        if entry["id"] in seen:
            raise AnnotationError(f"{where}: duplicate id")
        seen.add(entry["id"])
        yield where, entry


def validate_coco(data, path: Path, image_dir: Path | None = None, *, check_files: bool = True) -> dict:
    """Check a parsed COCO dict (see the module docstring); returns it with ``area``/``iscrowd`` filled."""
    if not isinstance(data, dict):
        raise AnnotationError(f"{path}: expected a JSON object with images, annotations, categories; got {type(data).__name__}")
    for key in ("images", "annotations", "categories"):
        if key not in data:
            raise AnnotationError(f"{path}: missing the {key!r} list (a COCO file has images, annotations, categories)")
        if not isinstance(data[key], list):
            raise AnnotationError(f"{path}: {key!r} must be a list, got {type(data[key]).__name__}")
    if not data["categories"]:
        raise AnnotationError(f"{path}: 'categories' is empty")
    cats: set[int] = set()
    for where, c in _entries(data, "categories", path, "category"):
        if c["id"] <= 0:
            raise AnnotationError(f"{where}: ids must be >= 1 (0 is the background)")
        cats.add(c["id"])
    sizes: dict[int, tuple[int, int]] = {}
    for where, img in _entries(data, "images", path, "image"):
        if not isinstance(img.get("file_name"), str) or not img["file_name"]:
            raise AnnotationError(f"{where}: missing 'file_name'")
        w, h = img.get("width"), img.get("height")
        if not (_int_id(w) and _int_id(h) and w > 0 and h > 0):
            raise AnnotationError(f"{where}: 'width' and 'height' must be positive integers, got {w!r} x {h!r}")
        if check_files and image_dir is not None and not (image_dir / img["file_name"]).is_file():
            raise AnnotationError(f"{where}: image file {image_dir / img['file_name']} does not exist")
        sizes[img["id"]] = (h, w)
    for where, ann in _entries(data, "annotations", path, "annotation"):
        if ann.get("image_id") not in sizes:
            raise AnnotationError(f"{where}: image_id {ann.get('image_id')!r} is not in 'images'")
        if ann.get("category_id") not in cats:
            raise AnnotationError(f"{where}: unknown category_id {ann.get('category_id')!r} (categories: {sorted(cats)})")
        box = ann.get("bbox")
        if not (isinstance(box, list) and len(box) == 4 and all(_number(v) for v in box)):
            raise AnnotationError(f"{where}: bbox must be [x, y, width, height] (4 finite numbers), got {box!r}")
        x, y, bw, bh = box
        h, w = sizes[ann["image_id"]]
        if bw <= 0 or bh <= 0:
            raise AnnotationError(f"{where}: bbox {box} has zero area (width and height must be > 0)")
        t = BOX_TOLERANCE
        if x < -t or y < -t or x + bw > w + t or y + bh > h + t:
            raise AnnotationError(f"{where}: bbox {box} lies outside image {ann['image_id']} ({w} x {h})")
        crowd = ann.get("iscrowd", 0)
        if crowd not in (0, 1) or isinstance(crowd, bool):
            raise AnnotationError(f"{where}: iscrowd must be 0 or 1, got {crowd!r}")
        ann["iscrowd"] = crowd
        seg = ann.get("segmentation")
        if seg is not None:
            _check_segmentation(where, seg, h, w)
        if "area" not in ann:
            ann["area"] = _mask_area(seg, h, w) if seg else float(bw * bh)
        elif not _number(ann["area"]) or ann["area"] < 0:
            raise AnnotationError(f"{where}: area must be a number >= 0, got {ann['area']!r}")
    return data


def load_coco(annotations: str | Path, image_dir: str | Path | None = None, *, check_files: bool = True) -> CocoSet:
    """Read and validate a COCO annotations file; ``image_dir`` is where ``file_name`` is looked up."""
    path = Path(annotations)
    image_dir = None if image_dir is None else Path(image_dir)
    data = validate_coco(_read_json(path), path, image_dir, check_files=check_files)
    return CocoSet(path, image_dir, data)


def _mask_area(seg, h: int, w: int) -> float:
    return float(decode_mask(seg, h, w).sum())


def decode_mask(seg, h: int, w: int) -> np.ndarray:
    """(h, w) uint8 mask of a COCO segmentation (polygons, uncompressed or compressed RLE) via pycocotools."""
    import warnings

    from pycocotools import mask as mask_utils

    if isinstance(seg, list):
        if not seg:
            return np.zeros((h, w), np.uint8)
        rle = mask_utils.merge(mask_utils.frPyObjects(seg, h, w))
    elif isinstance(seg["counts"], list):
        rle = mask_utils.frPyObjects(seg, h, w)
    else:
        rle = seg
    with warnings.catch_warnings():  # pycocotools 2.0.x under NumPy 2: a DeprecationWarning about __array__(copy=)
        warnings.simplefilter("ignore", DeprecationWarning)
        return mask_utils.decode(rle).astype(np.uint8)


def read_rgb(file: Path, where: str = ""):
    """The PIL RGB image of any file PIL reads (grayscale, palette -> RGB); AnnotationError naming ``file``
    (after ``where``, when given) if it is missing or unreadable."""
    from PIL import Image, UnidentifiedImageError

    head = f"{where}: " if where else ""
    try:
        with Image.open(file) as im:
            return im.convert("RGB")
    except FileNotFoundError:
        raise AnnotationError(f"{head}image file {file} does not exist") from None
    except (UnidentifiedImageError, OSError) as e:
        raise AnnotationError(f"{head}cannot read {file} ({e})") from None


def image_tensor(rgb) -> torch.Tensor:
    """(3, H, W) float32 in [0, 1] of a PIL RGB image."""
    arr = np.asarray(rgb, dtype=np.uint8)
    return torch.from_numpy(arr.copy()).permute(2, 0, 1).float().div_(255.0)


def flip_decision(seed: int, epoch: int, index: int) -> bool:
    """Whether image ``index`` is flipped in ``epoch``: a fixed function of (seed, epoch, index), no global RNG."""
    return bool(np.random.default_rng([seed, epoch, index]).random() < 0.5)


class CocoDetection(torch.utils.data.Dataset):
    """ds[i] -> (image (3, H, W) float32 in [0, 1], target dict); see the module docstring.

    Grayscale and palette images are converted to 3-channel RGB. ``hflip_seed``: flip each image with
    probability 1/2, decided by ``flip_decision(hflip_seed, epoch, i)`` (``set_epoch``), so a resumed run
    sees the same flips.
    """

    def __init__(self, coco: CocoSet, *, masks: bool = False, hflip_seed: int | None = None) -> None:
        if coco.image_dir is None:
            raise ValueError("coco: needs image_dir to load images")
        if masks:
            coco.require_masks()
        self.coco = coco
        self.masks = masks
        self.hflip_seed = hflip_seed
        self.epoch = 0
        self.label_of = {cid: k + 1 for k, cid in enumerate(coco.category_ids)}

    def __len__(self) -> int:
        return len(self.coco.images)

    def set_epoch(self, epoch: int) -> None:
        self.epoch = int(epoch)

    def load_image(self, i: int) -> torch.Tensor:
        info = self.coco.images[i]
        file = self.coco.image_dir / info["file_name"]
        im = read_rgb(file, f"{self.coco.path}: image id {info['id']}")
        if im.size != (info["width"], info["height"]):
            raise AnnotationError(
                f"{self.coco.path}: image id {info['id']}: {file} is {im.size[0]} x {im.size[1]}, "
                f"the annotations say {info['width']} x {info['height']}"
            )
        return image_tensor(im)

    def target(self, i: int) -> dict:
        info = self.coco.images[i]
        h, w = info["height"], info["width"]
        anns = [a for a in self.coco.anns_by_image[info["id"]] if not a["iscrowd"]]
        boxes = torch.tensor([a["bbox"] for a in anns], dtype=torch.float32).reshape(-1, 4)
        boxes[:, 2:] += boxes[:, :2]
        boxes[:, 0::2].clamp_(0, w)
        boxes[:, 1::2].clamp_(0, h)
        keep = (boxes[:, 2] > boxes[:, 0]) & (boxes[:, 3] > boxes[:, 1])
        labels = torch.tensor([self.label_of[a["category_id"]] for a in anns], dtype=torch.int64)
        target = {"boxes": boxes[keep], "labels": labels[keep], "image_id": info["id"]}
        if self.masks:
            m = [decode_mask(a["segmentation"], h, w) for a in anns]
            masks = torch.from_numpy(np.stack(m)) if m else torch.zeros((0, h, w), dtype=torch.uint8)
            target["masks"] = masks[keep]
        return target

    def __getitem__(self, i: int):
        image, target = self.load_image(i), self.target(i)
        if self.hflip_seed is not None and flip_decision(self.hflip_seed, self.epoch, i):
            w = image.shape[-1]
            image = image.flip(-1)
            boxes = target["boxes"].clone()
            boxes[:, [0, 2]] = w - target["boxes"][:, [2, 0]]
            target["boxes"] = boxes
            if "masks" in target:
                target["masks"] = target["masks"].flip(-1)
        return image, target


def collate(batch):
    """[(image, target), ...] -> ([image, ...], [target, ...]) (the lists torchvision detectors take)."""
    images, targets = zip(*batch) if batch else ((), ())
    return list(images), list(targets)
