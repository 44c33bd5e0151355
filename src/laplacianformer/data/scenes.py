"""FashionScenes: a generated, reproducible COCO-format detection / instance-segmentation data set.

Each scene is a grayscale canvas (size x size, 8-bit PNG mode 'L') with a textured background and
``min_items..max_items`` Fashion-MNIST items pasted at random scales and positions with bounded overlap.
Train scenes take items from Fashion-MNIST's training file only, val scenes from its test file only.

Layout written by ``make_scenes(out_dir)`` (the standard COCO one)::

    out_dir/train/000000.png ...               images, 8-bit grayscale ('L'); convert to 3 channels to use
    out_dir/val/000000.png ...
    out_dir/annotations/instances_train.json   COCO: info, images, annotations, categories (ids 1..10)
    out_dir/annotations/instances_val.json

Annotations: ``bbox`` [x, y, w, h] float pixels (tight box of the visible mask, pixel i covers [i, i+1)),
``area`` = visible mask pixel count, ``iscrowd`` 0, ``segmentation`` compressed COCO RLE
{"size": [h, w], "counts": str} (column-major), ``source`` {"split": "train"|"test", "index": i} (the
Fashion-MNIST item). Every step is integer arithmetic on numpy arrays and every random number comes from
``Generator(PCG64(SeedSequence(seed, spawn_key=(split, image_index))))``, so one image depends only on
(seed, split, index, options) and the pixels and JSON are the same on every machine. See
``docs/DETECTION.md`` (FashionScenes) for the options and the guarantee.

CLI: ``python -m laplacianformer.data.scenes --out DIR`` (``add_scenes_arguments`` / ``run_scenes``).
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import numbers
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from .fashion_mnist import CLASSES, load_fashion_mnist

GENERATOR_VERSION = 1
ITEM = 28  # Fashion-MNIST item side in pixels
SPLITS = {"train": ("train", 0), "val": ("test", 1)}  # scene split -> (Fashion-MNIST file, seed key)
PNG_COMPRESS_LEVEL = 1  # zlib level 1 with the Z_RLE strategy: as small as level 6 on these noisy scenes, 3x faster
PNG_COMPRESS_TYPE = 3  # zlib Z_RLE
MAX_ATTEMPTS = 20  # draws of scale/flip/position per item before it is skipped


# ----------------------------------------------------------------------------------------------------
# COCO run-length encoding (column-major), uncompressed counts and the compressed string form
# ----------------------------------------------------------------------------------------------------


def _runs_from_positions(pos: np.ndarray, total: int) -> list[int]:
    """RLE counts from the sorted column-major positions of the set pixels of a mask of ``total`` pixels."""
    if pos.size == 0:
        return [total]
    brk = np.flatnonzero(np.diff(pos) != 1) + 1
    starts = pos[np.concatenate(([0], brk))]
    ends = pos[np.concatenate((brk - 1, [pos.size - 1]))] + 1
    edges = np.empty(2 * starts.size + 2, dtype=np.int64)
    edges[0], edges[1:-1:2], edges[2:-1:2], edges[-1] = 0, starts, ends, total
    counts = np.diff(edges).tolist()
    if counts[-1] == 0:  # the mask ends with a set pixel: no trailing run of zeros
        counts.pop()
    return counts


def rle_counts(mask: np.ndarray) -> list[int]:
    """Uncompressed COCO RLE counts of a (h, w) mask: run lengths in column-major order, zeros first."""
    m = np.asarray(mask, dtype=bool)
    return _runs_from_positions(np.flatnonzero(m.T), m.size)


def encode_counts(counts: list[int]) -> str:
    """COCO's compressed RLE string: each count (minus the one two places back, from the fourth on) as
    little-endian 5-bit groups, 0x20 marking that another group follows and 0x10 of the last group
    being the sign, each group + 48 as an ASCII character."""
    x = np.asarray(counts, dtype=np.int64)
    if x.size == 0:
        return ""
    x = x.copy()
    x[3:] -= np.asarray(counts, dtype=np.int64)[1:-2]
    # groups needed: the fewest n with -2**(5n-1) <= x < 2**(5n-1)
    n = np.ones_like(x)
    for k in range(1, 13):
        n += (x >= (1 << (5 * k - 1))) | (x < -(1 << (5 * k - 1)))
    k = np.arange(int(n.max()))
    groups = (x[:, None] >> (5 * k[None, :])) & 0x1F
    chars = groups + 48 + np.where(k[None, :] < (n - 1)[:, None], 0x20, 0)
    return chars[k[None, :] < n[:, None]].astype(np.uint8).tobytes().decode("ascii")


def decode_counts(s: str) -> list[int]:
    """Inverse of ``encode_counts``."""
    counts: list[int] = []
    pos = 0
    while pos < len(s):
        x, shift, more = 0, 0, True
        while more:
            code = ord(s[pos]) - 48
            x |= (code & 0x1F) << shift
            more = bool(code & 0x20)
            pos += 1
            shift += 5
            if not more and code & 0x10:
                x -= 1 << shift
        if len(counts) > 2:
            x += counts[-2]
        counts.append(x)
    return counts


def rle_encode(mask: np.ndarray) -> dict:
    """(h, w) mask -> {"size": [h, w], "counts": compressed str}, as pycocotools' ``mask.encode`` writes."""
    h, w = mask.shape
    return {"size": [int(h), int(w)], "counts": encode_counts(rle_counts(mask))}


def rle_decode(rle: dict) -> np.ndarray:
    """COCO RLE (compressed str or uncompressed list counts) -> bool (h, w) mask."""
    h, w = rle["size"]
    counts = rle["counts"]
    if isinstance(counts, str):
        counts = decode_counts(counts)
    if sum(counts) != h * w:
        raise ValueError(f"rle: counts sum to {sum(counts)}, expected {h}*{w}={h * w}")
    values = np.arange(len(counts)) % 2 == 1
    return np.repeat(values, counts).reshape((h, w), order="F")


# ----------------------------------------------------------------------------------------------------
# Integer image operations (exact, so identical on every platform)
# ----------------------------------------------------------------------------------------------------


@functools.lru_cache(maxsize=4096)
def _bilinear_taps(n_in: int, n_out: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(i0, i1, w1) int64 (n_out,): output j = ((256 - w1) * x[i0] + w1 * x[i1]) / 256. Half-pixel centres
    (align_corners=False), source position clamped to [0, n_in - 1], fraction rounded to 1/256."""
    j = np.arange(n_out, dtype=np.int64)
    den = 2 * n_out
    num = np.clip((2 * j + 1) * n_in - n_out, 0, (n_in - 1) * den)  # source position = num / den
    i0 = np.minimum(num // den, n_in - 1)
    w1 = (((num - i0 * den) * 256 + den // 2) // den).astype(np.int32)
    i1 = np.minimum(i0 + 1, n_in - 1)
    for a in (i0, i1, w1):
        a.flags.writeable = False  # cached
    return i0, i1, w1


def resize_bilinear(img: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Integer (h, w) array -> integer (out_h, out_w), bilinear (half-pixel centres), in exact integer
    arithmetic (two taps per axis, weights in 1/256), the result rounded half up. int32 while every
    |value| < 2**15 (the sums stay below 2**31), else int64."""
    a = np.asarray(img)
    small = a.size == 0 or int(np.abs(a).max()) < 1 << 15
    a = a.astype(np.int32 if small else np.int64, copy=False)
    r0, r1, wr = _bilinear_taps(a.shape[0], out_h)
    c0, c1, wc = _bilinear_taps(a.shape[1], out_w)
    wr, wc = wr.astype(a.dtype, copy=False), wc.astype(a.dtype, copy=False)
    rows = a[r0] * (256 - wr)[:, None] + a[r1] * wr[:, None]
    acc = rows[:, c0] * (256 - wc) + rows[:, c1] * wc
    return (acc + (1 << 15)) >> 16


def _draw_background(rng: np.random.Generator, size: int) -> np.ndarray:
    """int32 (size, size) in 0..255: a grey level, two octaves of smooth value noise, faint strokes and
    ellipses (brighter or darker) and per-pixel grain."""
    low = size // 4  # the noise is summed at quarter resolution, then upsampled once
    noise = np.zeros((low, low), dtype=np.int32)
    for cells, amp in ((int(rng.integers(2, 6)), int(rng.integers(10, 35))),
                       (int(rng.integers(8, 17)), int(rng.integers(4, 13)))):
        grid = rng.integers(-amp, amp + 1, size=(cells + 1, cells + 1))
        noise += resize_bilinear(grid, low, low)
    bg = resize_bilinear(noise, size, size) + int(rng.integers(30, 100))
    yy, xx = np.ogrid[:size, :size]
    for _ in range(int(rng.integers(0, 5))):  # ellipses
        cy, cx = (int(v) for v in rng.integers(0, size, size=2))
        ry, rx = (int(v) for v in rng.integers(3, max(4, size // 8), size=2))
        delta = int(rng.integers(12, 41)) * (1 if rng.integers(0, 2) else -1)
        ys, xs = slice(max(cy - ry, 0), cy + ry + 1), slice(max(cx - rx, 0), cx + rx + 1)
        inside = (yy[ys] - cy) ** 2 * rx * rx + (xx[:, xs] - cx) ** 2 * ry * ry <= rx * rx * ry * ry
        bg[ys, xs] += np.where(inside, np.int32(delta), np.int32(0))
    for _ in range(int(rng.integers(1, 7))):  # strokes: straight segments 1..3 px thick
        y0, x0, y1, x1 = (int(v) for v in rng.integers(0, size, size=4))
        thick = int(rng.integers(1, 4))
        delta = int(rng.integers(12, 41)) * (1 if rng.integers(0, 2) else -1)
        n = max(abs(y1 - y0), abs(x1 - x0)) + 1
        t = np.arange(n, dtype=np.int64)
        off = np.arange(thick, dtype=np.int64)
        ys = (y0 + ((y1 - y0) * t) // max(n - 1, 1))[:, None, None] + off[None, :, None]
        xs = (x0 + ((x1 - x0) * t) // max(n - 1, 1))[:, None, None] + off[None, None, :]
        ys, xs = np.broadcast_arrays(ys, xs)
        inside = (ys < size) & (xs < size)
        bg[ys[inside], xs[inside]] += delta  # a pixel listed twice still changes once
    grain = int(rng.integers(2, 7))
    bg += rng.integers(-grain, grain + 1, size=(size, size), dtype=np.int16)
    return np.clip(bg, 0, 255)


# ----------------------------------------------------------------------------------------------------
# One scene
# ----------------------------------------------------------------------------------------------------


def scene_rng(seed: int, split: str, index: int) -> np.random.Generator:
    """The generator of one scene: PCG64 seeded from (seed, split key, image index) only."""
    ss = np.random.SeedSequence(seed, spawn_key=(SPLITS[split][1], index))
    return np.random.Generator(np.random.PCG64(ss))


def render_scene(
    images: np.ndarray,
    labels: np.ndarray,
    rng: np.random.Generator,
    *,
    size: int = 256,
    min_items: int = 1,
    max_items: int = 8,
    min_scale: float = 1.0,
    max_scale: float = 4.0,
    max_overlap: float = 0.3,
    min_area: int = 32,
    threshold: int = 24,
) -> tuple[np.ndarray, list[dict]]:
    """One scene from source items ``images`` uint8 (N, 28, 28) / ``labels`` (N,).

    Returns (uint8 (size, size) image, items), items bottom to top, each a dict with ``mask`` bool
    (size, size) (visible pixels), ``label`` (0..9), ``index`` (into ``images``), ``area`` (visible
    pixels), ``full_area`` (pixels before occlusion), ``bbox`` (x, y, w, h) ints and ``counts``
    (uncompressed RLE). Arguments are not validated here (``make_scenes`` does it); their defaults are
    those of ``make_scenes`` and the CLI (``scene_defaults``).
    """
    canvas = _draw_background(rng, size)
    owner = np.zeros((size, size), dtype=np.int32)  # 0 = background, k = item k (1-based), top-most
    full: list[int] = []  # each placed item's own mask area
    visible: list[int] = []  # its area left visible
    placed: list[dict] = []
    side_lo = max(1, round(ITEM * min_scale))
    side_hi = max(side_lo, round(ITEM * max_scale))
    for _ in range(int(rng.integers(min_items, max_items + 1))):
        src = int(rng.integers(0, len(images)))
        gain = int(rng.integers(160, 257))  # item contrast, /256
        for _attempt in range(MAX_ATTEMPTS):
            side = int(rng.integers(side_lo, side_hi + 1))
            flip = bool(rng.integers(0, 2))
            y, x = (int(v) for v in rng.integers(0, size - side + 1, size=2))
            item = images[src][:, ::-1] if flip else images[src]
            pix = resize_bilinear(item, side, side)
            mask = pix >= threshold
            area = int(mask.sum())
            if area < min_area:
                continue
            under = owner[y:y + side, x:x + side][mask]
            if np.count_nonzero(under) > max_overlap * area:
                continue
            hidden = np.bincount(under, minlength=len(full) + 1)[1:]
            left = np.asarray(visible, dtype=np.int64) - hidden
            keep = np.maximum(min_area, (1.0 - max_overlap) * np.asarray(full, dtype=np.float64))
            if np.any(left < keep):
                continue
            break
        else:
            continue  # no acceptable placement: the item is skipped
        k = len(full) + 1
        for j, h in enumerate(hidden.tolist()):
            visible[j] -= h
        full.append(area)
        visible.append(area)
        owner[y:y + side, x:x + side][mask] = k
        # paste: mask pixels take the item's value, the faint fringe (0 < v < threshold) blends into
        # what is below and belongs to no mask
        region = canvas[y:y + side, x:x + side]
        val = (pix * gain) >> 8
        alpha = np.minimum(pix, threshold)
        region[...] = (region * (threshold - alpha) + val * alpha) // threshold
        placed.append({"label": int(labels[src]), "index": src, "side": side, "x": x, "y": y})
    items = []
    for k, p in enumerate(placed, start=1):
        x, y, side = p["x"], p["y"], p["side"]
        crop = owner[y:y + side, x:x + side] == k
        area = int(np.count_nonzero(crop))
        if area < min_area:  # never true by construction; kept as the stated rule
            continue
        cols, rows = np.nonzero(crop.T)  # column-major order
        mask = np.zeros((size, size), dtype=bool)
        mask[y:y + side, x:x + side] = crop
        items.append({
            "mask": mask, "label": p["label"], "index": p["index"], "full_area": full[k - 1], "area": area,
            "bbox": (x + int(cols[0]), y + int(rows.min()), int(cols[-1] - cols[0]) + 1,
                     int(rows.max() - rows.min()) + 1),
            "counts": _runs_from_positions((cols + x).astype(np.int64) * size + rows + y, size * size),
        })
    return canvas.astype(np.uint8), items


def scene_defaults() -> dict:
    """The keywords of ``render_scene`` (how a scene is drawn) with their defaults."""
    params = inspect.signature(render_scene).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY}


def _annotation(item: dict, ann_id: int, image_id: int, source_split: str) -> dict:
    size = list(item["mask"].shape)
    return {
        "id": ann_id,
        "image_id": image_id,
        "category_id": item["label"] + 1,
        "bbox": [float(v) for v in item["bbox"]],
        "area": item["area"],
        "iscrowd": 0,
        "segmentation": {"size": size, "counts": encode_counts(item["counts"])},
        "source": {"split": source_split, "index": item["index"]},
    }


# ----------------------------------------------------------------------------------------------------
# The data set
# ----------------------------------------------------------------------------------------------------


def _check_int(name: str, v, lo: int, hi: int | None = None) -> int:
    if isinstance(v, bool) or not isinstance(v, numbers.Integral):
        raise ValueError(f"{name}: expected an integer, got {v!r}")
    v = int(v)
    if v < lo or (hi is not None and v > hi):
        rng_txt = f"in {lo}..{hi}" if hi is not None else f">= {lo}"
        raise ValueError(f"{name}: expected an integer {rng_txt}, got {v}")
    return v


def _check_float(name: str, v, lo: float, hi: float | None = None, lo_open: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        raise ValueError(f"{name}: expected a number, got {v!r}")
    v = float(v)
    bad = not math.isfinite(v) or v < lo or (lo_open and v == lo) or (hi is not None and v > hi)
    if bad:
        low = f"> {lo}" if lo_open else f">= {lo}"
        raise ValueError(f"{name}: expected a finite number {low}" + (f" and <= {hi}" if hi is not None else "")
                         + f", got {v}")
    return v


def validate_options(size, train, val, seed, min_items, max_items, min_scale, max_scale, max_overlap,
                     min_area, threshold) -> dict:
    """Checks every option; ValueError 'name: expected ..., got ...'. Returns them normalised."""
    o = {
        "size": _check_int("size", size, 128, 1024),
        "train": _check_int("train", train, 0),
        "val": _check_int("val", val, 0),
        "seed": _check_int("seed", seed, 0, 2**63 - 1),
        "min_items": _check_int("min_items", min_items, 0, 64),
        "max_items": _check_int("max_items", max_items, 0, 64),
        "min_scale": _check_float("min_scale", min_scale, 0.25),
        "max_scale": _check_float("max_scale", max_scale, 0.25),
        "max_overlap": _check_float("max_overlap", max_overlap, 0.0, 1.0),
        "min_area": _check_int("min_area", min_area, 1),
        "threshold": _check_int("threshold", threshold, 1, 255),
    }
    if o["train"] + o["val"] == 0:
        raise ValueError("train: train and val are both 0; nothing to generate")
    if o["max_items"] < o["min_items"]:
        raise ValueError(f"max_items: expected >= min_items ({o['min_items']}), got {o['max_items']}")
    if o["max_scale"] < o["min_scale"]:
        raise ValueError(f"max_scale: expected >= min_scale ({o['min_scale']}), got {o['max_scale']}")
    if round(ITEM * o["max_scale"]) > o["size"]:
        raise ValueError(f"max_scale: a {ITEM}-px item scaled by {o['max_scale']} does not fit in a "
                         f"{o['size']}-px scene (need max_scale <= {o['size'] / ITEM:g})")
    return o


def _dump_json(obj, path: Path) -> None:
    text = json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
    path.write_text(text + "\n", encoding="ascii", newline="\n")


def _save_png(img: np.ndarray, path: Path) -> None:
    from PIL import Image

    Image.fromarray(img, mode="L").save(path, format="PNG", compress_level=PNG_COMPRESS_LEVEL,
                                   compress_type=PNG_COMPRESS_TYPE, optimize=False)


def make_scenes(
    out_dir: str | Path,
    *,
    train: int = 4000,
    val: int = 1000,
    seed: int = 0,
    progress: bool = True,
    data_root: str | Path | None = None,
    overwrite: bool = False,
    **options,
) -> dict:
    """Writes FashionScenes to ``out_dir`` (layout in the module docstring); returns a summary dict
    {"out_dir", "train": {"images", "annotations"}, "val": {...}, "seconds"}. ``options`` are the keywords of
    ``render_scene`` (size, min_items, max_items, min_scale, max_scale, max_overlap, min_area, threshold).

    size: scene side in px (128..1024). train / val: number of scenes per split. seed: master seed.
    min_items..max_items: items drawn per scene (placements that fail MAX_ATTEMPTS times are skipped,
    so a scene can hold fewer, or none). min_scale..max_scale: item side = 28 * scale px (rounded).
    max_overlap: a new item may cover at most this fraction of its own mask area with earlier items, and
    every item keeps at least (1 - max_overlap) of its mask visible. min_area: smallest visible mask
    (px). threshold: intensity (1..255, of the resized item before its contrast gain) from which a pixel is
    part of the item's mask. data_root: Fashion-MNIST directory (default: the usual search path).
    overwrite: replace existing train/, val/ and annotations/ under out_dir instead of refusing.
    """
    defaults = scene_defaults()
    unknown = sorted(set(options) - set(defaults))
    if unknown:
        raise TypeError(f"make_scenes() got an unexpected keyword argument {unknown[0]!r}")
    o = validate_options(train=train, val=val, seed=seed, **{**defaults, **options})
    scene = {k: o[k] for k in defaults}
    out = Path(out_dir)
    parts = [out / "train", out / "val", out / "annotations"]
    existing = [p for p in parts if p.exists()]
    if existing and not overwrite:
        raise ValueError(f"out_dir: {out} already holds {existing[0].name}/; pass overwrite=True "
                         "(--overwrite) to replace it")
    for p in existing:
        shutil.rmtree(p) if p.is_dir() else p.unlink()
    from tqdm import tqdm

    t0 = time.perf_counter()
    counts = {s: o[s] for s in SPLITS}
    summary: dict = {"out_dir": str(out)}
    (out / "annotations").mkdir(parents=True, exist_ok=True)
    bar = tqdm(total=sum(counts.values()), desc="scenes", unit="img", disable=not progress)
    try:
        for split, (source_split, _) in SPLITS.items():
            n = counts[split]
            img_dir = out / split
            img_dir.mkdir(parents=True, exist_ok=True)
            images, labels = load_fashion_mnist(source_split, data_root) if n else (None, None)
            coco_images, anns = [], []
            bar.set_postfix_str(split, refresh=False)
            for i in range(n):
                img, items = render_scene(images, labels, scene_rng(o["seed"], split, i), **scene)
                name = f"{i:06d}.png"
                _save_png(img, img_dir / name)
                image_id = i + 1
                coco_images.append({"id": image_id, "file_name": name, "width": o["size"], "height": o["size"]})
                for item in items:
                    anns.append(_annotation(item, len(anns) + 1, image_id, source_split))
                bar.update(1)
            info = {
                "description": f"FashionScenes {split}: Fashion-MNIST {source_split} items on textured "
                               "backgrounds (laplacianformer.data.scenes, docs/DETECTION.md)",
                "version": GENERATOR_VERSION,
                "split": split,
                "source": f"Fashion-MNIST {source_split} file",
                "image_mode": "L",
                "settings": dict(o),
            }
            categories = [{"id": c + 1, "name": name, "supercategory": "fashion"}
                          for c, name in enumerate(CLASSES)]
            _dump_json({"info": info, "licenses": [], "images": coco_images, "annotations": anns,
                        "categories": categories}, out / "annotations" / f"instances_{split}.json")
            summary[split] = {"images": n, "annotations": len(anns)}
    finally:
        bar.close()
    summary["seconds"] = time.perf_counter() - t0
    return summary


# ----------------------------------------------------------------------------------------------------
# Command line
# ----------------------------------------------------------------------------------------------------


_OPTION_HELP = {  # option -> help, in --help order; the type and default are those of make_scenes / render_scene
    "size": "side of every scene in pixels, 128..1024",
    "train": "number of train scenes, items from Fashion-MNIST's training file",
    "val": "number of val scenes, items from Fashion-MNIST's test file",
    "seed": "master seed; the same seed and options give the same files",
    "min_items": "fewest items drawn per scene, 0..64",
    "max_items": f"most items drawn per scene, min-items..64; an item with no valid placement after {MAX_ATTEMPTS} "
                 "tries is skipped",
    "min_scale": "smallest item scale, >= 0.25: a 28-px item becomes 28*scale px",
    "max_scale": "largest item scale; 28*max-scale must fit in --size",
    "max_overlap": "0..1: a new item may lie on earlier items with at most this fraction of its mask, and every "
                   "item keeps at least (1 - max-overlap) of its mask visible",
    "min_area": "smallest visible mask in pixels an item may have",
    "threshold": "item intensity 1..255 from which a pixel belongs to its mask",
}


def add_scenes_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Adds the FashionScenes options to ``parser`` (for ``laplacianformer data scenes``); returns it."""
    p = parser
    p.add_argument("--out", required=True, metavar="DIR",
                   help="output directory; receives train/, val/ (PNG, 8-bit grayscale) and "
                        "annotations/instances_{train,val}.json (COCO)")
    params = inspect.signature(make_scenes).parameters
    defaults = {**{k: params[k].default for k in ("train", "val", "seed")}, **scene_defaults()}
    for name, text in _OPTION_HELP.items():
        p.add_argument("--" + name.replace("_", "-"), type=type(defaults[name]), default=defaults[name],
                       help=text + " (default: %(default)s)")
    p.add_argument("--data-root", default=None, metavar="DIR",
                   help="Fashion-MNIST directory (default: $LAPLACIANFORMER_DATA, then the usual locations)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace train/, val/ and annotations/ if DIR already has them")
    p.add_argument("--progress", action=argparse.BooleanOptionalAction, default=True,
                   help="show a progress bar (default: on)")
    return p


def run_scenes(args: argparse.Namespace) -> int:
    """Runs ``make_scenes`` from parsed ``add_scenes_arguments`` options; prints a one-line summary and
    returns 0. A bad option raises ValueError starting with its flag ('--size: expected ...')."""
    try:
        s = make_scenes(args.out, progress=args.progress, data_root=args.data_root, overwrite=args.overwrite,
                        **{name: getattr(args, name) for name in _OPTION_HELP})
    except ValueError as e:
        head, sep, rest = str(e).partition(":")
        if sep and (head in _OPTION_HELP or head == "out_dir"):
            flag = "--out" if head == "out_dir" else "--" + head.replace("_", "-")
            raise ValueError(f"{flag}:{rest}") from None
        raise
    print(f"FashionScenes: {s['train']['images']} train images ({s['train']['annotations']} objects), "
          f"{s['val']['images']} val images ({s['val']['annotations']} objects) in {s['out_dir']} "
          f"({s['seconds']:.1f} s)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m laplacianformer.data.scenes``: errors print one line and exit with status 2."""
    parser = argparse.ArgumentParser(
        prog="python -m laplacianformer.data.scenes",
        description="Generate FashionScenes, a COCO-format detection / instance-segmentation data set of "
                    "Fashion-MNIST items on textured backgrounds (docs/DETECTION.md).")
    add_scenes_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_scenes(args)
    except (ValueError, OSError) as e:
        print(f"{parser.prog}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
