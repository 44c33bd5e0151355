"""Training of torchvision detectors on COCO-layout data: ``train_detector(config, run_dir)``.

One step: a batch of the epoch's ``DistributedSampler`` order (one shard per rank; seed + epoch) ->
images and targets (``CocoDetection``, seeded horizontal flips) -> autocast forward (the detector returns
its loss dict) -> backward (GradScaler for fp16) -> optional gradient clipping -> AdamW step at the
scheduled rate (``train.schedule.lr_at``: linear warm-up, cosine). After each epoch: COCO evaluation of
the val split (every rank predicts its shard, results gathered, COCOeval on rank 0), a row in
``history.json``, ``losses.png`` and ``ap.png``, and an atomic checkpoint. SIGINT/SIGTERM checkpoint at the
next step boundary and return with ``interrupted`` set. Progress: tqdm bars on a terminal, else a line at
least every 30 s on stderr (``train.progress.ProgressLine``: step, images/s, loss, ETA) and one per epoch.

Run directory (rank 0 writes; docs/DETECTION.md):

    train_config.json        the run's settings (``DetectConfig``)
    checkpoint.safetensors   model + optimizer + schedule position + scaler + RNG + history (+ .prev)
    model.safetensors        final weights; metadata: train_config, categories
    history.json             {"epochs": [...], "steps": [...]}
    metrics.json             COCO metrics of the final weights on the val split
    losses.png, ap.png       loss curves per step; val AP / AP50 per epoch

The checkpoint is one safetensors file written with ``checkpoint.save_training_state`` (temp file, fsync,
rename; the layout classification runs use too): tensors under ``model/`` and ``state/``, everything else
as JSON in the header metadata, so a resumed run ends with the same weights as an uninterrupted one (same
machine, threads and world size). Resuming falls back to ``checkpoint.safetensors.prev`` (with a warning)
when the latest file is damaged.
"""

from __future__ import annotations

import contextlib
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path

import torch

from ..checkpoint import (
    CheckpointError, TrainingState, load_checkpoint, load_training_state, read_metadata, save_training_state, save_weights,
)
from ..hub import CHECKPOINT_NAME, TRAIN_CONFIG_NAME, WEIGHTS_NAME
from ..layers.token_mixer import saved_attn_kwargs
from ..ops.settings import SETTINGS_VERSION
from ..train.config import AMP_MODES
from ..train.distributed import barrier, broadcast_object, cleanup, init_device, resolve_device
from ..train.engine import param_groups
from ..train.evaluate import autocast_context
from ..train.interrupt import StopFlag
from ..train.progress import ProgressLine
from ..train.schedule import lr_at
from ..train.state import capture_rng, restore_rng, seed_everything
from .builders import DETECTORS, REFERENCE_BACKBONES, build_detector
from .coco import AnnotationError, CocoDetection, CocoSet, collate, load_coco, split_paths
from .evaluate import coco_metrics, predict_results

FORMAT = "laplacianformer.detect/1"
HISTORY_NAME = "history.json"
METRICS_NAME = "metrics.json"
LOSSES_PNG = "losses.png"
AP_PNG = "ap.png"
RESUME_MAY_CHANGE = ("progress", "threads", "workers", "save_every_steps", "eval_batch_size", "device")
"""Settings a resumed run may change; every other one must match the run's train_config.json."""


@dataclass
class DetectConfig:
    """Every setting of a detection run (saved as ``train_config.json``)."""

    data: str = ""
    detector: str = "retinanet"
    backbone: str = "laplacianformer_tiny"
    backbone_kwargs: dict = field(default_factory=dict)
    detector_kwargs: dict = field(default_factory=dict)
    img_size: int = 256
    fpn_channels: int = 256
    epochs: int = 12
    max_steps: int | None = None
    batch_size: int = 8
    eval_batch_size: int = 8
    lr: float = 2e-4
    min_lr: float = 1e-6
    weight_decay: float = 0.05
    warmup_steps: int = 100
    clip_grad: float | None = None
    score_thresh: float = 0.05
    hflip: bool = True
    amp: str = "off"
    seed: int = 0
    train_split: str = "train"
    val_split: str = "val"
    train_subset: int | None = None
    val_subset: int | None = None
    eval_every: int = 1
    save_every_steps: int | None = None
    workers: int = 0
    threads: int | None = None
    progress: bool = True
    device: str = "auto"

    def validate(self) -> "DetectConfig":
        from ..models import list_models

        if not self.data:
            raise ValueError("data: a directory in the COCO layout is required (--data)")
        if self.detector not in DETECTORS:
            raise ValueError(f"detector: expected one of {list(DETECTORS)}, got {self.detector!r}")
        names = list(list_models()) + list(REFERENCE_BACKBONES)
        if self.backbone not in names:
            raise ValueError(f"backbone: expected one of {names}, got {self.backbone!r}")
        for name in ("backbone_kwargs", "detector_kwargs"):
            if not isinstance(getattr(self, name), dict):
                raise ValueError(f"{name}: expected a JSON object, got {getattr(self, name)!r}")
        fixed = sorted(set(self.detector_kwargs) & {"min_size", "max_size", "detections_per_img",
                                                     "box_detections_per_img", "score_thresh", "box_score_thresh"})
        if fixed:
            raise ValueError(f"detector_kwargs: {fixed} are set by img_size / score_thresh (100 detections per image)")
        if self.amp not in AMP_MODES:
            raise ValueError(f"amp: expected one of {list(AMP_MODES)}, got {self.amp!r}")
        for name in ("img_size", "fpn_channels", "epochs", "batch_size", "eval_batch_size"):
            if int(getattr(self, name)) < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {getattr(self, name)}")
        if self.img_size < 32:
            raise ValueError(f"img_size: expected at least 32 pixels, got {self.img_size}")
        for name in ("max_steps", "train_subset", "val_subset", "save_every_steps", "threads"):
            v = getattr(self, name)
            if v is not None and int(v) < 1:
                raise ValueError(f"{name}: expected an integer >= 1, got {v}")
        if not 0 <= self.score_thresh <= 1:
            raise ValueError(f"score_thresh: expected a number in [0, 1], got {self.score_thresh}")
        if not self.lr > 0 or self.min_lr < 0 or self.weight_decay < 0 or self.warmup_steps < 0 or self.eval_every < 0:
            raise ValueError("lr > 0, min_lr >= 0, weight_decay >= 0, warmup_steps >= 0, eval_every >= 0 are required")
        return self

    def to_dict(self) -> dict:
        """The fields, and ``settings_version``: the defaults they were written under (``ops.settings``)."""
        return {**asdict(self), "settings_version": SETTINGS_VERSION}

    @classmethod
    def from_dict(cls, d: dict, where: str = "config") -> "DetectConfig":
        """A config from a dict; one without ``settings_version`` (version 0.1) keeps the backbone attention
        defaults of its time (``layers.token_mixer.saved_attn_kwargs``)."""
        d = dict(d)
        version = d.pop("settings_version", 1)
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"{where}: unknown settings {unknown}")
        backbone = d.get("backbone_kwargs")
        if isinstance(backbone, dict) and isinstance(backbone.get("attn_kwargs", {}), dict):
            kwargs = saved_attn_kwargs(backbone.get("attn", "laplacian"), backbone.get("attn_kwargs", {}), version)
            if kwargs:
                d["backbone_kwargs"] = {**backbone, "attn_kwargs": kwargs}
        return cls(**d)

    def save(self, path: Path) -> None:
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(self.to_dict(), indent=1, sort_keys=True) + "\n")
        tmp.replace(path)

    @classmethod
    def load(cls, path: Path) -> "DetectConfig":
        try:
            d = json.loads(Path(path).read_text())
        except FileNotFoundError:
            raise CheckpointError(f"checkpoint: {path}: missing (not a detection run directory?)") from None
        except json.JSONDecodeError as e:
            raise CheckpointError(f"checkpoint: {path}: invalid JSON ({e.msg})") from None
        return cls.from_dict(d, str(path))


# ----------------------------------------------------------------------------------------------------
# Data and model
# ----------------------------------------------------------------------------------------------------


def load_split(config: DetectConfig, split: str, subset: int | None) -> CocoSet:
    return load_coco(*split_paths(config.data, split)).subset(subset)


def categories_of(coco: CocoSet) -> list[dict]:
    """[{"id", "name"}] sorted by id: label k (1..K) is entry k - 1."""
    return [{"id": c["id"], "name": str(c.get("name", c["id"]))} for c in coco.categories]


def build_model(config: DetectConfig, num_categories: int) -> torch.nn.Module:
    """The detector of ``config`` (K categories + background); at most 100 detections per image (COCO's
    maxDets) scoring at least ``score_thresh``."""
    if config.detector == "retinanet":
        extra = {"detections_per_img": 100, "score_thresh": config.score_thresh}
    else:
        extra = {"box_detections_per_img": 100, "box_score_thresh": config.score_thresh}
    return build_detector(config.detector, config.backbone, num_categories + 1, img_size=config.img_size,
                          fpn_channels=config.fpn_channels, backbone_kwargs=config.backbone_kwargs,
                          **config.detector_kwargs, **extra)


# ----------------------------------------------------------------------------------------------------
# Trainer
# ----------------------------------------------------------------------------------------------------


class DetectionTrainer:
    """``DetectionTrainer(config, run_dir, resume=False).fit()`` -> summary dict (see the module docstring)."""

    def __init__(self, config: DetectConfig, run_dir: str | Path, *, resume: bool = False) -> None:
        self.config = config.validate()
        self.run_dir = Path(run_dir)
        self.device = resolve_device(config.device)
        self._prev_threads = torch.get_num_threads()
        if config.threads:
            torch.set_num_threads(config.threads)
        self.device, self.dist = init_device(self.device)
        self.is_main = self.dist.is_main
        seed_everything(config.seed)

        self.train_set = load_split(config, config.train_split, config.train_subset)
        self.val_set = load_split(config, config.val_split, config.val_subset) if config.eval_every else None
        self.categories = categories_of(self.train_set)
        if self.val_set is not None and categories_of(self.val_set) != self.categories:
            raise AnnotationError(f"{self.val_set.path}: categories differ from those of {self.train_set.path}")
        masks = config.detector == "maskrcnn"
        self.train_data = CocoDetection(self.train_set, masks=masks, hflip_seed=config.seed if config.hflip else None)
        self.val_data = CocoDetection(self.val_set, masks=masks) if self.val_set is not None else None
        self.iou_types = ("bbox", "segm") if masks else ("bbox",)

        self.net = build_model(config, len(self.categories)).to(self.device)
        self.optimizer = torch.optim.AdamW(param_groups(self.net, config.weight_decay), lr=config.lr)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=config.amp == "fp16")
        self.sampler = torch.utils.data.DistributedSampler(
            self.train_data, num_replicas=self.dist.world_size, rank=self.dist.rank, shuffle=True,
            seed=config.seed, drop_last=False)
        self.steps_per_epoch = math.ceil(len(self.sampler) / config.batch_size)
        total = config.epochs * self.steps_per_epoch
        self.total_steps = min(total, config.max_steps) if config.max_steps else total
        self.warmup_steps = min(config.warmup_steps, self.total_steps // 2)
        self.epoch = self.step_in_epoch = self.global_step = 0
        self.epoch_sums: dict[str, float] = {}
        self.history: dict = {"epochs": [], "steps": []}
        self.train_time = 0.0
        self.last_eval: dict | None = None

        if resume:
            self._restore(load_training_state(self.run_dir / CHECKPOINT_NAME, format=FORMAT, fallback_previous=True))
        elif self.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.is_main:
            config.save(self.run_dir / TRAIN_CONFIG_NAME)
        barrier(self.dist)
        self.model = self.net
        if self.dist.enabled:
            import warnings

            # depthwise conv gradients come out channels-last; DDP copies them into its buckets (harmless)
            warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
            ids = [self.device.index] if self.device.type == "cuda" else None
            self.model = torch.nn.parallel.DistributedDataParallel(self.net, device_ids=ids)

    # -- state --------------------------------------------------------------------------------------
    def _state(self) -> dict:
        return {
            "optimizer": self.optimizer.state_dict(),
            "scaler": self.scaler.state_dict() if self.scaler.is_enabled() else {},
            "rng": capture_rng(),
            "position": {"epoch": self.epoch, "step": self.step_in_epoch, "global_step": self.global_step,
                         "world_size": self.dist.world_size, "total_steps": self.total_steps},
            "epoch_sums": dict(self.epoch_sums),
            "history": self.history,
            "train_time": self.train_time,
            "last_eval": self.last_eval,
        }

    def _metadata(self) -> dict:
        return {"train_config": json.dumps(self.config.to_dict(), sort_keys=True),
                "categories": json.dumps(self.categories), "detector": self.config.detector,
                "backbone": self.config.backbone}

    def _restore(self, loaded: TrainingState) -> None:
        model_state, st, meta, path = loaded
        if json.loads(meta.get("categories", "null")) != self.categories:
            raise CheckpointError(f"checkpoint: {path}: its categories differ from those of {self.train_set.path}")
        pos = st["position"]
        if pos["world_size"] != self.dist.world_size:
            raise CheckpointError(f"checkpoint: {path}: written with world size {pos['world_size']}, resumed with "
                                  f"{self.dist.world_size} (the data order would differ)")
        missing, unexpected = self.net.load_state_dict(model_state, strict=False)
        if missing or unexpected:
            raise CheckpointError(f"checkpoint: {path}: weights do not fit the model (missing {missing[:3]}, "
                                  f"unexpected {unexpected[:3]})")
        self.optimizer.load_state_dict(st["optimizer"])
        if st["scaler"]:
            self.scaler.load_state_dict(st["scaler"])
        self.epoch, self.step_in_epoch, self.global_step = pos["epoch"], pos["step"], pos["global_step"]
        self.epoch_sums = dict(st["epoch_sums"])
        self.history = st["history"]
        self.train_time = st["train_time"]
        self.last_eval = st["last_eval"]
        restore_rng(st["rng"])

    def save(self) -> None:
        if self.is_main:
            save_training_state(self.run_dir / CHECKPOINT_NAME, self.net.state_dict(), self._state(), format=FORMAT,
                                metadata=self._metadata())
        barrier(self.dist)

    # -- steps --------------------------------------------------------------------------------------
    def _batches(self, epoch: int) -> list[list[int]]:
        self.sampler.set_epoch(epoch)
        order = list(self.sampler)
        b = self.config.batch_size
        return [order[i:i + b] for i in range(0, len(order), b)]

    def _train_step(self, images, targets) -> dict[str, float]:
        cfg = self.config
        lr = lr_at(self.global_step, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                   base_lr=cfg.lr, min_lr=cfg.min_lr)
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        images = [im.to(self.device, non_blocking=True) for im in images]
        targets = [{k: (v.to(self.device) if torch.is_tensor(v) else v) for k, v in t.items()} for t in targets]
        with autocast_context(self.device, cfg.amp):
            losses = self.model(images, targets)
        loss = sum(losses.values())
        values = torch.stack([loss.detach().float()] + [v.detach().float() for v in losses.values()])
        if self.dist.enabled:
            torch.distributed.all_reduce(values)
            values /= self.dist.world_size
        if not torch.isfinite(values).all():
            names = ["loss", *losses]
            raise FloatingPointError(
                f"step {self.global_step + 1}: non-finite loss ({dict(zip(names, values.tolist()))}); "
                f"lower --lr or set --clip-grad; the last checkpoint in {self.run_dir} is unchanged")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if cfg.clip_grad:
            self.scaler.unscale_(self.optimizer)
            torch.nn.utils.clip_grad_norm_(self.net.parameters(), cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        row = {"loss": values[0].item(), **{k: v for k, v in zip(losses, values[1:].tolist())}}
        return {"lr": lr, **row}

    def evaluate(self) -> dict:
        """COCO metrics of the current weights on the val split (every rank returns rank 0's numbers)."""
        cfg = self.config
        results = predict_results(
            self.net, self.val_data, batch_size=cfg.eval_batch_size, device=self.device,
            amp_context=lambda: autocast_context(self.device, cfg.amp), rank=self.dist.rank,
            world_size=self.dist.world_size, progress=self._bar_on(), desc="val")
        metrics = coco_metrics(self.val_set, results, self.iou_types) if self.is_main else None
        return broadcast_object(metrics, self.dist)

    def _bar_on(self) -> bool:
        return bool(self.config.progress and self.is_main and sys.stderr.isatty())

    def _end_epoch(self, complete: bool) -> None:
        cfg = self.config
        n = max(1, self.epoch_sums.get("steps", 0))
        evaluate = self.val_data is not None and ((self.epoch + 1) % max(cfg.eval_every, 1) == 0 or not complete
                                                   or self.global_step >= self.total_steps)
        if evaluate:
            self.last_eval = self.evaluate()
        row = {"epoch": self.epoch + 1 if complete else round(self.epoch + self.step_in_epoch / self.steps_per_epoch, 4),
               "step": self.global_step,
               "loss": self.epoch_sums.get("loss", 0.0) / n,
               "losses": {k: v / n for k, v in self.epoch_sums.items()
                          if k not in ("loss", "steps", "images", "time", "cpu_time")},
               "train_time_s": self.epoch_sums.get("time", 0.0),
               "cpu_time_s": self.epoch_sums.get("cpu_time", 0.0),
               "images_per_s": self.epoch_sums.get("images", 0) / max(self.epoch_sums.get("time", 0.0), 1e-9),
               "val": self.last_eval if evaluate else None}
        self.history["epochs"].append(row)
        if self.is_main:
            self._write_history()
            val = ""
            if row["val"]:
                b = row["val"]["bbox"]
                val = f" | val bbox AP {b['AP']:.3f} AP50 {b['AP50']:.3f}"
                if "segm" in row["val"]:
                    val += f" segm AP {row['val']['segm']['AP']:.3f}"
            comps = " ".join(f"{k} {v:.3f}" for k, v in row["losses"].items())
            print(f"epoch {row['epoch']}/{cfg.epochs} step {self.global_step}/{self.total_steps} loss {row['loss']:.4f} "
                  f"({comps}){val} | {row['images_per_s']:.2f} img/s", flush=True)
        if complete:
            self.epoch += 1
            self.step_in_epoch = 0
        self.epoch_sums = {}

    def _write_history(self) -> None:
        from .plots import plot_ap, plot_losses

        (self.run_dir / HISTORY_NAME).write_text(json.dumps(self.history, indent=1) + "\n")
        title = f"{self.config.detector} {self.config.backbone} {self.config.backbone_kwargs or ''}".strip()
        plot_losses(self.history, self.run_dir / LOSSES_PNG, title)
        plot_ap(self.history, self.run_dir / AP_PNG, title)

    def fit(self) -> dict:
        cfg = self.config
        start = time.perf_counter()
        interrupted = None
        gen = torch.Generator().manual_seed(cfg.seed)  # the DataLoader draws its base seed here, not from the global RNG
        timed = ProgressLine("detect train", self.total_steps, start=self.global_step,
                             enabled=self.is_main and not self._bar_on())  # lines every 30 s without bars
        with StopFlag() as stop:
            while self.global_step < self.total_steps and self.epoch < cfg.epochs:
                batches = self._batches(self.epoch)
                self.train_data.set_epoch(self.epoch)
                loader = torch.utils.data.DataLoader(
                    self.train_data, batch_sampler=batches[self.step_in_epoch:], collate_fn=collate,
                    num_workers=cfg.workers, generator=gen, persistent_workers=False)
                bar = None
                if self._bar_on():
                    from tqdm import tqdm

                    bar = tqdm(total=len(batches), initial=self.step_in_epoch, desc=f"epoch {self.epoch + 1}/{cfg.epochs}",
                               leave=False, dynamic_ncols=True)
                self.net.train()
                for images, targets in loader:
                    t0, c0 = time.perf_counter(), time.process_time()
                    row = self._train_step(images, targets)
                    dt = time.perf_counter() - t0
                    self.epoch_sums["cpu_time"] = self.epoch_sums.get("cpu_time", 0.0) + time.process_time() - c0
                    self.global_step += 1
                    self.step_in_epoch += 1
                    self.train_time += dt
                    for k, v in row.items():
                        if k != "lr":
                            self.epoch_sums[k] = self.epoch_sums.get(k, 0.0) + v
                    self.epoch_sums["steps"] = self.epoch_sums.get("steps", 0) + 1
                    self.epoch_sums["images"] = self.epoch_sums.get("images", 0) + len(images) * self.dist.world_size
                    self.epoch_sums["time"] = self.epoch_sums.get("time", 0.0) + dt
                    self.history["steps"].append({"step": self.global_step, "epoch": self.epoch + 1, **row})
                    if bar is not None:
                        bar.update(1)
                        bar.set_postfix(loss=f"{row['loss']:.3f}", lr=f"{row['lr']:.1e}", refresh=False)
                    timed.update(images=len(images) * self.dist.world_size, loss=row["loss"],
                                 note=f"epoch {self.epoch + 1}/{cfg.epochs}")
                    interrupted = stop.received(self.dist)
                    if interrupted:
                        break
                    if self.global_step >= self.total_steps:
                        break
                    if cfg.save_every_steps and self.global_step % cfg.save_every_steps == 0:
                        self.save()
                if bar is not None:
                    bar.close()
                if interrupted:
                    self.save()
                    break
                complete = self.step_in_epoch >= len(batches)
                self._end_epoch(complete)
                self.save()
        return self._finish(interrupted, time.perf_counter() - start)

    def _finish(self, interrupted: str | None, wall: float) -> dict:
        result = {"run_dir": str(self.run_dir), "detector": self.config.detector, "backbone": self.config.backbone,
                  "backbone_kwargs": self.config.backbone_kwargs, "steps": self.global_step,
                  "total_steps": self.total_steps, "epochs_completed": self.epoch, "interrupted": interrupted,
                  "train_time_s": self.train_time, "wall_time_s": wall, "metrics": None, "rank": self.dist.rank}
        if interrupted is None:
            metrics = self.last_eval
            if self.val_data is not None and metrics is None:
                metrics = self.evaluate()
            result["metrics"] = metrics
            if self.is_main:
                save_weights(self.net.state_dict(), self.run_dir / WEIGHTS_NAME, self._metadata())
                if metrics is not None:
                    out = {**metrics, "run": str(self.run_dir), "split": self.config.val_split,
                           "subset": self.config.val_subset, "step": self.global_step}
                    (self.run_dir / METRICS_NAME).write_text(json.dumps(out, indent=1) + "\n")
        barrier(self.dist)
        return result

    def close(self) -> None:
        cleanup(self.dist, self._prev_threads)


def train_detector(config: DetectConfig, run_dir: str | Path, *, resume: bool = False) -> dict:
    """Train (or resume) one detector; returns the summary dict (``metrics``: final val COCO metrics)."""
    trainer = DetectionTrainer(config, run_dir, resume=resume)
    try:
        return trainer.fit()
    finally:
        trainer.close()


def load_run(run_dir: str | Path, *, device: str | torch.device = "cpu") -> tuple[torch.nn.Module, DetectConfig, list[dict]]:
    """(detector in eval mode, its config, categories) of a run: ``model.safetensors``, else the checkpoint's weights."""
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise CheckpointError(f"checkpoint: {run_dir}: no such run directory")
    config = DetectConfig.load(run_dir / TRAIN_CONFIG_NAME)
    weights = run_dir / WEIGHTS_NAME
    if weights.exists():
        state, meta = load_checkpoint(weights), read_metadata(weights)
    else:
        state, _, meta, _ = load_training_state(run_dir / CHECKPOINT_NAME, format=FORMAT, fallback_previous=True)
    categories = json.loads(meta.get("categories", "null") or "null")
    if not categories:
        raise CheckpointError(f"checkpoint: {run_dir}: the weights carry no categories")
    model = build_model(config, len(categories))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(f"checkpoint: {run_dir}: weights do not fit the model (missing {missing[:3]}, unexpected {unexpected[:3]})")
    return model.to(device).eval(), config, categories


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Temporarily ``torch.set_num_threads(n)`` (no-op for None)."""
    prev = torch.get_num_threads()
    if n:
        torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(prev)
