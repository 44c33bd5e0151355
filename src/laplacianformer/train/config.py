"""``TrainConfig``: every setting of a training run, saved as ``train_config.json`` in the run directory.

``read_train_config(run_dir)`` reads it back. ``data`` is stored as an absolute path when it is an image
folder (``resolve_data``), so a run evaluates and resumes from any working directory.

Defaults are a small-data version of the DeiT/SOFT recipe (DESIGN.md §5, training recipe): AdamW with
weight decay 0.05, linear warm-up then cosine decay per step, label smoothing 0.1, gradient clipping,
drop path. Mixup/CutMix/RandAugment/EMA exist but are off by default: on a few thousand 32-px images and
a few epochs they slow convergence more than they regularise (turn them on for long runs).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..checkpoint import CheckpointError
from ..hub import CONFIG_NAME, TRAIN_CONFIG_NAME, old_layout
from ..layers.token_mixer import check_token_mixer, preset_kwargs, saved_attn_kwargs
from ..ops.settings import SETTINGS_VERSION

AMP_MODES = ("off", "bf16", "fp16")


@dataclass
class TrainConfig:
    """Settings of one run. Field names double as CLI flags (``--batch-size`` for ``batch_size``)."""

    model: str = "laplacianformer_micro"
    attn: str = "laplacian"
    attn_kwargs: dict[str, Any] = field(default_factory=dict)
    attn_preset: str | None = None  # named attn_kwargs of attn="laplacian" (layers.ATTN_PRESETS), attn_kwargs over them
    model_kwargs: dict[str, Any] = field(default_factory=dict)
    data: str = "fashion-mnist"
    img_size: int = 32
    in_chans: int | None = None
    train_subset: int | None = None
    test_subset: int | None = None
    holdout: int | None = None  # training images held out as the validation split, evaluated instead of test
    holdout_seed: int = 0       # the split's seed (fixed per protocol, independent of ``seed``)
    epochs: int = 10
    batch_size: int = 64
    eval_batch_size: int = 256
    lr: float = 1e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_epochs: float = 1.0
    label_smoothing: float = 0.1
    mixup: float = 0.0
    cutmix: float = 0.0
    mix_prob: float = 1.0
    randaugment: bool = False
    random_crop: bool = True
    hflip: bool = True
    drop_path: float = 0.1
    clip_grad: float | None = 1.0
    ema: bool = False
    ema_decay: float = 0.999
    amp: str = "off"
    seed: int = 0
    out: str | None = None
    num_workers: int = 0
    max_steps: int | None = None
    time_budget: float | None = None
    save_every_steps: int | None = None
    progress: bool = True
    log_every: int | None = None
    verify_images: bool = True
    device: str = "auto"
    threads: int | None = None

    def validate(self) -> "TrainConfig":
        """Raises ValueError/TypeError whose message starts with the field name."""
        def pos_int(name, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v!r}")

        def real(name, lo, hi=math.inf, lo_open=False, allow_none=False):
            v = getattr(self, name)
            if v is None and allow_none:
                return
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{name}: expected a finite number, got {v!r}")
            if v < lo or (lo_open and v == lo) or v > hi:
                rng = f"({lo}, {hi}]" if lo_open else f"[{lo}, {hi}]"
                raise ValueError(f"{name}: expected a value in {rng}, got {v!r}")

        for name in ("img_size", "epochs", "batch_size", "eval_batch_size"):
            pos_int(name)
        for name in ("train_subset", "test_subset", "holdout", "max_steps", "save_every_steps", "threads", "log_every"):
            pos_int(name, allow_none=True)
        if self.img_size < 8:
            raise ValueError(f"img_size: expected an integer >= 8, got {self.img_size}")
        real("lr", 0, lo_open=True)
        real("min_lr", 0)
        real("weight_decay", 0)
        real("warmup_epochs", 0)
        real("label_smoothing", 0, 1)
        real("mixup", 0)
        real("cutmix", 0)
        real("mix_prob", 0, 1)
        real("drop_path", 0, 1)
        real("clip_grad", 0, lo_open=True, allow_none=True)
        real("ema_decay", 0, 1)
        real("time_budget", 0, lo_open=True, allow_none=True)
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp: expected one of {list(AMP_MODES)}, got {self.amp!r}")
        if self.in_chans is not None and self.in_chans not in (1, 3):
            raise ValueError(f"in_chans: expected 1 or 3, got {self.in_chans!r}")
        if isinstance(self.num_workers, bool) or not isinstance(self.num_workers, int) or self.num_workers < 0:
            raise ValueError(f"num_workers: expected an integer >= 0, got {self.num_workers!r}")
        for name in ("seed", "holdout_seed"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"{name}: expected an integer >= 0, got {v!r}")
        for name in ("attn_kwargs", "model_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise TypeError(f"{name}: expected a dict, got {type(getattr(self, name)).__name__}")
        # the models' own check of attn, its preset and its keys
        check_token_mixer(self.attn, preset_kwargs(self.attn, self.attn_preset, self.attn_kwargs))
        return self

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_saved(self) -> dict[str, Any]:
        """The fields as a file or checkpoint stores them: with ``settings_version``, the operator defaults
        they were written under (``ops.settings.SETTINGS_VERSION``; read back by ``saved_config``)."""
        return {**self.to_dict(), "settings_version": SETTINGS_VERSION}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrainConfig":
        """Builds a config from a dict, ignoring unknown keys (configs from newer versions still load)."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_saved(), indent=2, sort_keys=True) + "\n")

    @classmethod
    def load(cls, path: str | Path) -> "TrainConfig":
        return cls.from_dict(saved_config(json.loads(Path(path).read_text())))


def saved_config(d: dict[str, Any]) -> dict[str, Any]:
    """A stored config dict (``to_saved``: a run's train_config.json, a checkpoint's config) as this version
    reads it: one without ``settings_version`` (written by 0.1) keeps the defaults of its time for what it
    does not name (``layers.token_mixer.saved_attn_kwargs``: an unscaled injective map); the version key
    dropped."""
    d = dict(d)
    version = d.pop("settings_version", 1)
    if isinstance(d.get("attn_kwargs"), dict):
        d["attn_kwargs"] = saved_attn_kwargs(d.get("attn", "laplacian"), d["attn_kwargs"], version)
    return d


def resolve_data(data: str) -> str:
    """``data`` as a run stores it: a built-in name unchanged, an image-folder path absolute (from the working
    directory)."""
    from ..data import BUILTIN

    return data if data in BUILTIN else str(Path(data).expanduser().resolve())


def read_train_config(run_dir: str | Path) -> TrainConfig:
    """The ``TrainConfig`` of a run directory (its ``train_config.json``); CheckpointError naming the
    directory otherwise."""
    d = Path(run_dir)
    if not (d / TRAIN_CONFIG_NAME).is_file():
        raise CheckpointError(f"checkpoint: {d}: no {TRAIN_CONFIG_NAME} (expected a training run directory; "
                              + old_layout(f"a run keeping its settings in {CONFIG_NAME}") + ")")
    return TrainConfig.load(d / TRAIN_CONFIG_NAME)
