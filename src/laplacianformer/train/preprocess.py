"""A model's inference preprocessing, read from its timm pretrained cfg: ``Preprocessing.from_cfg(cfg)``.

    prep = Preprocessing.from_cfg(model.pretrained_cfg)
    x = prep.normalize(torch.stack([prep.read(p) for p in paths]))     # float (B, C, H, W)

A run of this package stores ``crop_pct`` 1, bilinear and ``crop_mode`` "squash" (runs written before
``crop_mode`` was stored: a cfg without it and ``crop_pct`` 1 is read as "squash"): the whole image resized
to ``input_size``, by ``data.folder.read_image``, the code its training and evaluation decode image folders
with. Other cfgs (timm ``train.py`` checkpoints, the family default of crop 0.9, bicubic) follow timm's
evaluation transform: "center" scales the shorter side to size / crop_pct and crops the centre, "squash"
scales both sides to size / crop_pct and crops the centre. Then ``(x / 255 - mean) / std``
(``augment.normalize``). Any PIL mode is converted to grayscale or RGB (alpha dropped, palettes expanded,
16-bit grey levels scaled to 8 bits: ``data.folder.eight_bit``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import Dataset

from ..data.folder import decode_image, read_image
from .augment import normalize

INTERPOLATIONS = ("nearest", "bilinear", "bicubic", "box", "hamming", "lanczos")
CROP_MODES = ("center", "squash")


@dataclass(frozen=True)
class Preprocessing:
    """Decode, resize / crop to ``size`` (H, W) with ``interpolation``, normalise with ``mean`` / ``std``."""

    in_chans: int
    size: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    crop_pct: float = 1.0
    crop_mode: str = "squash"

    @classmethod
    def from_cfg(cls, cfg: Mapping, *, img_size: int | None = None) -> "Preprocessing":
        """From a timm pretrained cfg (``input_size``, ``mean``, ``std``, ``interpolation``, ``crop_pct``,
        ``crop_mode``); ``img_size`` replaces the cfg's (square). ValueError naming the bad entry."""
        size = cfg.get("input_size")
        if not (isinstance(size, (tuple, list)) and len(size) == 3 and all(isinstance(v, int) and v > 0 for v in size)):
            raise ValueError(f"pretrained_cfg: input_size: expected (channels, height, width), got {size!r}")
        in_chans, hw = int(size[0]), (int(size[1]), int(size[2]))
        if img_size is not None:
            hw = (int(img_size), int(img_size))
        mean, std = tuple(float(v) for v in cfg.get("mean") or ()), tuple(float(v) for v in cfg.get("std") or ())
        for name, v in (("mean", mean), ("std", std)):
            if len(v) not in (1, in_chans):
                raise ValueError(f"pretrained_cfg: {name}: expected 1 or {in_chans} values, got {list(v)}")
        if not all(s > 0 for s in std):
            raise ValueError(f"pretrained_cfg: std: expected values > 0, got {list(std)}")
        interpolation = str(cfg.get("interpolation") or "bilinear")
        if interpolation not in INTERPOLATIONS:
            raise ValueError(f"pretrained_cfg: interpolation: expected one of {list(INTERPOLATIONS)}, "
                             f"got {interpolation!r}")
        crop_pct = float(cfg.get("crop_pct") or 0.875)  # timm's default when unset
        if not 0 < crop_pct <= 1:
            raise ValueError(f"pretrained_cfg: crop_pct: expected a number in (0, 1], got {crop_pct}")
        crop_mode = cfg.get("crop_mode") or ("squash" if crop_pct == 1 else "center")
        if crop_mode not in CROP_MODES:
            raise ValueError(f"pretrained_cfg: crop_mode: expected one of {list(CROP_MODES)}, got {crop_mode!r}")
        return cls(in_chans, hw, mean, std, interpolation, crop_pct, crop_mode)

    @property
    def whole_image(self) -> bool:
        """Whether this is a run's preprocessing: the whole image resized bilinearly to a square."""
        return (self.crop_mode, self.crop_pct, self.interpolation) == ("squash", 1.0, "bilinear") \
            and self.size[0] == self.size[1]

    def describe(self) -> str:
        """One line, e.g. '1 x 32 x 32, whole image, bilinear, mean (0.3,), std (0.4,)'."""
        how = "whole image" if self.crop_mode == "squash" and self.crop_pct == 1 else \
            f"{self.crop_mode} crop {self.crop_pct:g}"
        return (f"{self.in_chans} x {self.size[0]} x {self.size[1]}, {how}, {self.interpolation}, "
                f"mean {self.mean}, std {self.std}")

    def read(self, path: str | Path) -> torch.Tensor:
        """uint8 (C, H, W) of an image file; DataError naming the file when it cannot be decoded."""
        path = Path(path)
        if self.whole_image:
            return read_image(path, self.size[0], self.in_chans)
        return decode_image(path, self.in_chans, self._resize_crop)

    def _resize_crop(self, im):
        """Scale (timm's eval rule for ``crop_mode``) and crop the centre ``size``."""
        from PIL import Image

        h, w = self.size
        sh, sw = math.floor(h / self.crop_pct), math.floor(w / self.crop_pct)
        iw, ih = im.size
        if self.crop_mode == "squash":
            nh, nw = sh, sw
        elif sh == sw:  # the shorter side to the scale size, the longer one in proportion (truncated)
            nw, nh = (sw, int(sw * ih / iw)) if iw <= ih else (int(sh * iw / ih), sh)
        else:
            ratio = max(sh / ih, sw / iw)
            nh, nw = round(ih * ratio), round(iw * ratio)
        resample = getattr(Image.Resampling, self.interpolation.upper())
        if (nw, nh) != (iw, ih):
            im = im.resize((nw, nh), resample)
        top, left = int(round((nh - h) / 2.0)), int(round((nw - w) / 2.0))
        return im.crop((left, top, left + w, top + h))

    def normalize(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (B, C, H, W) -> float32 ``(x / 255 - mean) / std``."""
        return normalize(images, self.mean, self.std)


class ImageFiles(Dataset):
    """Image files read through a ``Preprocessing``: items (uint8 (C, H, W), label); ``mean`` / ``std`` /
    ``classes`` as ``train.evaluate`` reads them."""

    def __init__(self, samples, classes, prep: Preprocessing) -> None:
        self.samples = [(Path(p), int(label)) for p, label in samples]
        self.classes = tuple(classes)
        self.prep = prep
        self.in_chans = prep.in_chans
        self.mean, self.std = prep.mean, prep.std

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i: int):
        path, label = self.samples[i]
        return self.prep.read(path), label
