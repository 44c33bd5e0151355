"""The training loop: ``Trainer(config).fit()`` and the functional ``train(config)``.

One step: batch (seeded order, see ``batches``) -> seeded augmentation -> autocast forward -> soft-target
cross-entropy -> backward (GradScaler for fp16) -> gradient clipping -> AdamW step at the scheduled rate
-> EMA update -> one JSON line in ``log.jsonl``. After each epoch: evaluation on the test split, a row in
``epochs.csv``/``epochs.json``, the curves PNG, ``model_best.safetensors`` when the test top-1 is the best
so far, and an atomic checkpoint (model, optimiser, schedule step, scaler, EMA, RNG states, data
position). SIGINT/SIGTERM set a flag; the loop checkpoints at the next step boundary and returns with
``interrupted`` set. Resuming restores all of it, so a killed-and-resumed run
ends with the same weights as an uninterrupted one (same machine, thread count and world size).

Resuming with settings that change the learning-rate schedule (``epochs``, ``max_steps``,
``warmup_epochs``, ``batch_size``) is refused with a message naming the rate before and after, unless
``allow_schedule_change=True`` (CLI ``--allow-schedule-change``): then the warm-up/cosine schedule is laid
over the new length and a warning says how the rate changes.

Progress: tqdm bars when ``progress`` is on and stderr is a terminal; otherwise one line per epoch on
stderr, a line at least every 30 s (``progress.ProgressLine``: step, images/s, loss, ETA) and one every
``log_every`` steps, so logs of jobs without a TTY show the run as it goes.
``summary.json``: ``train_time_s`` is the time spent in training steps and ``wall_time_s`` the time spent
in ``fit`` (steps, evaluation, checkpoints), both summed over every session of a resumed run, so
wall >= train; ``session_wall_time_s`` is this session's part.
"""

from __future__ import annotations

import copy
import json
import resource
import sys
import time
from pathlib import Path
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from ..checkpoint import CheckpointError, save_training_state, save_weights
from ..data import DataSplits, build_datasets
from ..hub import (
    BEST_WEIGHTS_NAME, CHECKPOINT_NAME, EMA_WEIGHTS_NAME, TRAIN_CONFIG_NAME, TRAIN_FORMAT, WEIGHTS_NAME,
    load_model_state, read_run_checkpoint, write_config,
)
from ..models import create_model
from .augment import mix_batch, normalize, rand_augment, random_crop_flip
from .batches import epoch_indices, iterate, steps_per_epoch
from .config import TrainConfig, resolve_data, saved_config
from .distributed import barrier, broadcast_object, cleanup, init_device, resolve_device
from .ema import ModelEma
from .evaluate import autocast_context, evaluate
from .geometry import model_kwargs_for
from .interrupt import StopFlag
from .plots import plot_curves
from .progress import ProgressLine
from .runlog import StepLog, write_epochs
from .schedule import lr_at
from .state import capture_rng, restore_rng, seed_everything, step_seed

SUMMARY = "summary.json"
CURVES = "curves.png"


def build_model(config: TrainConfig, num_classes: int, in_chans: int) -> nn.Module:
    """``laplacianformer.models.create_model`` with the run's attention, drop path and model overrides
    (``geometry.model_kwargs_for``: the same model the protocols check)."""
    return create_model(
        config.model, num_classes=num_classes, in_chans=in_chans, attn=config.attn,
        attn_kwargs=dict(config.attn_kwargs) or None, attn_preset=config.attn_preset, drop_path_rate=config.drop_path,
        **model_kwargs_for(config.model_kwargs, config.img_size),
    )


def run_pretrained_cfg(model: nn.Module, config: TrainConfig, splits: DataSplits) -> dict:
    """The model's timm pretrained cfg for this run's data: input size (channels, img_size), mean/std,
    bilinear resize of the whole image (crop_pct 1, crop_mode "squash": what ``data.folder.read_image`` does,
    and timm's eval transform with this cfg), class names (``label_names``)."""
    size = config.img_size
    pool = -(-size // model.stride)
    return dict(
        getattr(model, "pretrained_cfg", None) or {}, num_classes=len(splits.classes),
        input_size=(splits.in_chans, size, size), pool_size=(pool, pool), mean=tuple(splits.train.mean),
        std=tuple(splits.train.std), interpolation="bilinear", crop_pct=1.0, crop_mode="squash",
        label_names=tuple(str(c) for c in splits.classes),
    )


def count_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def peak_memory_mb(device: torch.device) -> tuple[float, str]:
    """(peak MiB, what it measures): CUDA allocator peak, or this process's peak resident set size."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**20, "cuda_max_allocated"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, "process_peak_rss"


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: no weight decay on biases, norms (1-D tensors) and the model's ``no_weight_decay()``
    names (a torchvision detector has none: 1-D tensors only). Classification and detection runs."""
    skip = set(model.no_weight_decay()) if hasattr(model, "no_weight_decay") else set()
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if p.ndim <= 1 or name in skip else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def default_run_dir(config: TrainConfig) -> Path:
    return Path("runs") / f"{config.model}-{config.attn}-{time.strftime('%Y%m%d-%H%M%S')}"


class ResumePoint(NamedTuple):
    """A training checkpoint read once: the file read and its content (``Trainer.state_dict()``)."""

    path: Path
    state: dict


def read_resume(path: str | Path) -> ResumePoint:
    """Read the training checkpoint of a run directory or checkpoint file (``hub.read_run_checkpoint``:
    ``checkpoint.safetensors``, falling back to the previous file with a warning when the latest is
    damaged); CheckpointError naming the file unless it is one."""
    return ResumePoint(*read_run_checkpoint(path))


class Trainer:
    """Holds the model, optimiser, data and run directory of one training run.

    ``resume``: a run directory or checkpoint file to continue from, or a ``ResumePoint`` already read
    (its saved config is used unless a ``config`` is given; the model fields must match).
    ``splits``: prebuilt data (skips ``build_datasets``).
    ``allow_schedule_change``: resume even when the settings change the learning-rate schedule (see the
    module docstring); refused otherwise.
    """

    def __init__(self, config: TrainConfig | None = None, *, resume: str | Path | ResumePoint | None = None,
                 splits: DataSplits | None = None, allow_schedule_change: bool = False) -> None:
        self.resume_state = None
        resume_dir = None
        if resume is not None:
            ckpt_path, self.resume_state = resume if isinstance(resume, ResumePoint) else read_resume(resume)
            resume_dir = ckpt_path.parent
            saved = saved_config(self.resume_state["config"])
            if config is None:
                config = TrainConfig.from_dict(saved)
            if config.out is None:
                config.out = str(ckpt_path.parent)
            for key in ("model", "attn", "attn_kwargs", "attn_preset", "model_kwargs", "img_size", "data"):
                old, new = saved.get(key), getattr(config, key)
                if key == "data" and isinstance(old, str) and isinstance(new, str):
                    old, new = resolve_data(old), resolve_data(new)
                if old != new:
                    raise CheckpointError(f"checkpoint: {ckpt_path}: was written with {key}={saved.get(key)!r}, "
                                          f"not {getattr(config, key)!r}")
        self.config = (config or TrainConfig()).validate()
        cfg = self.config
        cfg.data = resolve_data(cfg.data)  # stored absolute: the run works from any directory
        self._prev_threads = torch.get_num_threads()
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        self.device, self.dist = init_device(resolve_device(cfg.device))
        seed_everything(cfg.seed)
        self.splits = splits or build_datasets(
            cfg.data, cfg.img_size, in_chans=cfg.in_chans, train_subset=cfg.train_subset,
            test_subset=cfg.test_subset, seed=cfg.seed, check_images=cfg.verify_images,
            holdout=cfg.holdout, holdout_seed=cfg.holdout_seed)
        self.classes = self.splits.classes
        self.eval_split = "val" if cfg.holdout else "test"  # what the history's test_* columns hold
        self.num_classes = len(self.classes)
        self.model = build_model(cfg, self.num_classes, self.splits.in_chans).to(self.device)
        self.model.pretrained_cfg = run_pretrained_cfg(self.model, cfg, self.splits)
        # the model the EMA weights are evaluated in: built once (a copy, no RNG drawn), refilled per evaluation
        self.ema_model = copy.deepcopy(self.model) if cfg.ema else None
        self.net = self.model
        if self.dist.enabled:
            self.net = nn.parallel.DistributedDataParallel(
                self.model, device_ids=[self.device.index] if self.device.type == "cuda" else None)
        self.optimizer = torch.optim.AdamW(param_groups(self.model, cfg.weight_decay), lr=cfg.lr)
        self.scaler = torch.amp.GradScaler(self.device.type, enabled=cfg.amp == "fp16")
        self.ema = ModelEma(self.model, cfg.ema_decay) if cfg.ema else None
        self.steps_per_epoch = steps_per_epoch(len(self.splits.train), cfg.batch_size, self.dist.world_size)
        self.total_steps = cfg.epochs * self.steps_per_epoch
        if cfg.max_steps is not None:
            self.total_steps = min(self.total_steps, cfg.max_steps)
        # the epochs this run trains (fewer than ``epochs`` under ``max_steps``): what progress lines count to
        self.epochs_planned = max(1, -(-self.total_steps // self.steps_per_epoch))
        self.warmup_steps = min(int(round(cfg.warmup_epochs * self.steps_per_epoch)), max(self.total_steps - 1, 0))
        self.epoch, self.step_in_epoch, self.global_step = 0, 0, 0
        self.history: list[dict] = []
        self.best: dict | None = None  # {"top1", "epoch", "steps"} of model_best.safetensors
        self.epoch_stats = {"loss_sum": 0.0, "correct": 0, "seen": 0, "train_time": 0.0}
        self.train_time = 0.0
        self.wall_time = 0.0  # time in fit() of earlier sessions (this one's: _session_start)
        self._session_start: float | None = None
        self.images_seen = 0
        run_dir = Path(cfg.out) if cfg.out else default_run_dir(cfg)
        self.run_dir = Path(broadcast_object(str(run_dir), self.dist))
        if self.dist.is_main:
            self.run_dir.mkdir(parents=True, exist_ok=True)
        if self.resume_state is not None:
            self._restore(self.resume_state)
            self._check_schedule(self.resume_state, resume_dir, allow_schedule_change)
            self.resume_state = None
        if self.dist.is_main:
            cfg.save(self.run_dir / TRAIN_CONFIG_NAME)
            write_config(self.model, self.run_dir)
        barrier(self.dist)

    def state_dict(self) -> dict:
        return {
            "format": TRAIN_FORMAT,
            "config": self.config.to_saved(),
            "classes": [str(c) for c in self.classes],
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": {"step": self.global_step, "total_steps": self.total_steps,
                          "warmup_steps": self.warmup_steps},
            "scaler": self.scaler.state_dict(),
            "ema": self.ema.state_dict() if self.ema is not None else None,
            "rng": capture_rng(),
            "position": {"epoch": self.epoch, "step": self.step_in_epoch, "global_step": self.global_step,
                         "sampler_seed": self.config.seed, "world_size": self.dist.world_size},
            "epoch_stats": dict(self.epoch_stats),
            "history": self.history,
            "counters": {"train_time": self.train_time, "wall_time": self._wall_now(),
                         "images_seen": self.images_seen},
            "best": self.best,
        }

    def _restore(self, st: dict) -> None:
        load_model_state(self.model, st["model"], str(self.run_dir))
        self.optimizer.load_state_dict(st["optimizer"])
        if st["scaler"]:
            self.scaler.load_state_dict(st["scaler"])
        if self.ema is not None and st.get("ema"):
            self.ema.load_state_dict(st["ema"])
        pos = st["position"]
        if pos.get("world_size", 1) != self.dist.world_size:
            raise CheckpointError(f"checkpoint: {self.run_dir}: written with world size {pos['world_size']}, "
                                  f"resumed with {self.dist.world_size} (the data order would differ)")
        self.epoch, self.step_in_epoch, self.global_step = pos["epoch"], pos["step"], pos["global_step"]
        self.epoch_stats = dict(st["epoch_stats"])
        self.history = list(st["history"])
        self.train_time = st["counters"]["train_time"]
        self.wall_time = st["counters"]["wall_time"]
        self.images_seen = st["counters"]["images_seen"]
        self.best = st.get("best")
        restore_rng(st["rng"])

    def _check_schedule(self, st: dict, run_dir: Path, allow: bool) -> None:
        """Refuse (ValueError naming the changed setting) or announce a resumed run whose learning-rate
        schedule differs from the checkpoint's (total or warm-up steps)."""
        sched = st.get("scheduler") or {}
        old_total, old_warm = sched.get("total_steps"), sched.get("warmup_steps")
        if old_total is None or (old_total, old_warm) == (self.total_steps, self.warmup_steps):
            return
        cfg, saved = self.config, st.get("config") or {}
        keys = [k for k in ("epochs", "max_steps", "warmup_epochs", "batch_size") if saved.get(k) != getattr(cfg, k)]
        keys = keys or ["epochs"]
        step = self.global_step
        before = lr_at(step, total_steps=old_total, warmup_steps=old_warm or 0,
                       base_lr=saved.get("lr", cfg.lr), min_lr=saved.get("min_lr", cfg.min_lr))
        after = lr_at(step, total_steps=self.total_steps, warmup_steps=self.warmup_steps, base_lr=cfg.lr,
                      min_lr=cfg.min_lr)
        what = (f"{', '.join(f'{k}={getattr(cfg, k)}' for k in keys)} (the run has "
                f"{', '.join(f'{k}={saved.get(k)}' for k in keys)}) changes its learning-rate schedule from "
                f"{old_total} to {self.total_steps} steps (warm-up {old_warm} -> {self.warmup_steps}): "
                f"at step {step} the rate goes from {before:.3g} to {after:.3g}")
        if not allow:
            raise ValueError(f"{keys[0]}: resuming {run_dir} with {what}; pass --allow-schedule-change "
                             "(allow_schedule_change=True) to continue on the new schedule, or resume with "
                             f"{keys[0]}={saved.get(keys[0])} to keep it")
        if self.dist.is_main:
            print(f"warning: {keys[0]}: resuming with {what}; the warm-up/cosine schedule now spans "
                  f"{self.total_steps} steps", file=sys.stderr, flush=True)

    def save(self) -> None:
        """``checkpoint.safetensors`` (``checkpoint.save_training_state``: atomic, the previous file kept as
        ``.prev``)."""
        if self.dist.is_main:
            state = self.state_dict()
            model = state.pop("model")
            cfg = self.config
            meta = {"model": cfg.model, "attn": cfg.attn, "train_config": json.dumps(cfg.to_saved()),
                    "classes": json.dumps(state["classes"])}
            save_training_state(self.run_dir / CHECKPOINT_NAME, model, state, format=TRAIN_FORMAT, metadata=meta)
        barrier(self.dist)

    def _train_step(self, images: torch.Tensor, labels: torch.Tensor) -> tuple[float, int, float]:
        """One optimiser step; returns (loss, correct predictions in the batch, learning rate)."""
        cfg = self.config
        g = torch.Generator().manual_seed(step_seed(cfg.seed, self.epoch, self.step_in_epoch))
        if cfg.randaugment:
            images = rand_augment(images, int(torch.randint(0, 2**31 - 1, (), generator=g)))
        images = images.to(self.device, non_blocking=True)
        labels = labels.to(self.device, non_blocking=True)
        images = random_crop_flip(images, g, pad=max(1, cfg.img_size // 8), crop=cfg.random_crop, flip=cfg.hflip)
        x = normalize(images, self.splits.train.mean, self.splits.train.std)
        x, target = mix_batch(x, labels, g, num_classes=self.num_classes, mixup=cfg.mixup, cutmix=cfg.cutmix,
                              prob=cfg.mix_prob, smoothing=cfg.label_smoothing)
        lr = lr_at(self.global_step, total_steps=self.total_steps, warmup_steps=self.warmup_steps,
                   base_lr=cfg.lr, min_lr=cfg.min_lr)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        with autocast_context(self.device, cfg.amp):
            logits = self.net(x)
        logits = logits.float()
        loss = torch.sum(-target * F.log_softmax(logits, dim=1), dim=1).mean()
        if not torch.isfinite(loss):
            raise FloatingPointError(f"loss: not finite ({loss.item()}) at step {self.global_step}; "
                                     "try a lower --lr or --amp off")
        self.optimizer.zero_grad(set_to_none=True)
        self.scaler.scale(loss).backward()
        if cfg.clip_grad is not None:
            self.scaler.unscale_(self.optimizer)
            nn.utils.clip_grad_norm_(self.model.parameters(), cfg.clip_grad)
        self.scaler.step(self.optimizer)
        self.scaler.update()
        if self.ema is not None:
            self.ema.update(self.model)
        correct = int((logits.argmax(1) == labels).sum())
        return float(loss.detach()), correct, lr

    def _eval_model(self) -> nn.Module:
        """The weights evaluated: the model, or with EMA the EMA weights copied into ``ema_model``."""
        if self.ema is None:
            return self.model
        self.ema.copy_to(self.ema_model)
        return self.ema_model

    def _evaluate(self, desc: str) -> dict:
        cfg = self.config
        return evaluate(self._eval_model(), self.splits.test, batch_size=cfg.eval_batch_size, device=self.device,
                        amp=cfg.amp, num_classes=self.num_classes, progress="bars" if self._bars() else "lines",
                        num_workers=cfg.num_workers, dist_info=self.dist, desc=desc)

    def _end_epoch(self) -> None:
        st = self.epoch_stats
        ev = self._evaluate(f"eval {self.epoch + 1}")
        row = {
            "epoch": self.epoch + 1,
            "steps": self.global_step,
            "lr": self.optimizer.param_groups[0]["lr"],
            "train_loss": st["loss_sum"] / max(st["seen"], 1),
            "train_top1": st["correct"] / max(st["seen"], 1),
            "test_loss": ev["loss"],
            "test_top1": ev["top1"],
            "test_top5": ev["top5"],
            "epoch_train_time": st["train_time"],
        }
        if self.history and self.history[-1]["epoch"] == row["epoch"]:
            self.history[-1] = row
        else:
            self.history.append(row)
        self.last_eval = ev
        if self.best is None or ev["top1"] > self.best["top1"]:
            self.best = {"top1": ev["top1"], "epoch": row["epoch"], "steps": self.global_step}
            if self.dist.is_main:
                meta = {"model": self.config.model, "attn": self.config.attn,
                        **{k: str(v) for k, v in self.best.items()}}
                evaluated = self.model if self.ema_model is None else self.ema_model  # filled by _evaluate
                save_weights(evaluated.state_dict(), self.run_dir / BEST_WEIGHTS_NAME, meta)
        if self.dist.is_main:
            self._say(f"epoch {row['epoch']}/{self.epochs_planned}  step {self.global_step}/{self.total_steps}  "
                      f"train loss {row['train_loss']:.4f}  train top-1 {row['train_top1']:.3f}  "
                      f"{self.eval_split} loss {row['test_loss']:.4f}  {self.eval_split} top-1 {row['test_top1']:.3f}  "
                      f"lr {row['lr']:.2e}  {row['epoch_train_time']:.1f}s")
            write_epochs(self.run_dir, self.history)
            plot_curves({self.config.attn: self.history}, self.run_dir / CURVES,
                        title=f"{self.config.model} ({self.config.attn}) on {self.config.data}")

    def _bars(self) -> bool:
        """tqdm bars: ``progress`` on, the main rank, and stderr a terminal (else plain lines)."""
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(self.config.progress and self.dist.is_main and isatty is not None and isatty())

    def _say(self, line: str) -> None:
        """One progress line on stderr (main rank), written around the tqdm bars when they are shown."""
        if not self.dist.is_main:
            return
        if self._bars():
            from tqdm.auto import tqdm

            tqdm.write(line, file=sys.stderr)
        else:
            print(line, file=sys.stderr, flush=True)

    def _wall_now(self) -> float:
        """Time in ``fit`` over every session so far (the ``wall_time`` counter)."""
        if self._session_start is None:
            return self.wall_time
        return self.wall_time + time.perf_counter() - self._session_start

    def fit(self) -> dict:
        """Runs until the epochs, ``max_steps`` or ``time_budget`` are used up, or a signal arrives."""
        cfg = self.config
        start_wall = time.perf_counter()
        self._session_start = start_wall
        bars = self._bars()
        mark = (time.perf_counter(), self.images_seen)  # throughput of the step lines
        log = StepLog(self.run_dir, resume_step=self.global_step) if self.dist.is_main else None
        timed = ProgressLine("train", self.total_steps, start=self.global_step,
                             enabled=self.dist.is_main and not bars)  # lines every 30 s without bars
        self.last_eval = None
        interrupted = None
        from tqdm.auto import tqdm

        try:
            with StopFlag() as stop:
                while self.epoch < cfg.epochs and self.global_step < self.total_steps and interrupted is None:
                    idx = epoch_indices(len(self.splits.train), epoch=self.epoch, seed=cfg.seed,
                                        rank=self.dist.rank, world=self.dist.world_size)
                    n_steps = min(self.steps_per_epoch, self.step_in_epoch + self.total_steps - self.global_step)
                    bar = tqdm(total=n_steps, initial=self.step_in_epoch, disable=not bars, dynamic_ncols=True,
                               desc=f"epoch {self.epoch + 1}/{self.epochs_planned}", leave=True)
                    batches = iterate(self.splits.train, idx, cfg.batch_size, start_step=self.step_in_epoch,
                                      num_workers=cfg.num_workers)
                    t0 = time.perf_counter()
                    for images, labels in batches:
                        if self.step_in_epoch >= n_steps:
                            break
                        loss, correct, lr = self._train_step(images, labels)
                        b = labels.shape[0] * self.dist.world_size
                        self.epoch_stats["loss_sum"] += loss * labels.shape[0]
                        self.epoch_stats["correct"] += correct
                        self.epoch_stats["seen"] += labels.shape[0]
                        self.images_seen += b
                        self.global_step += 1
                        self.step_in_epoch += 1
                        if log is not None:
                            log.write({"step": self.global_step, "epoch": self.epoch + 1,
                                       "step_in_epoch": self.step_in_epoch, "loss": loss, "lr": lr,
                                       "batch_top1": correct / labels.shape[0], "time": time.time()})
                        bar.update(1)
                        bar.set_postfix(loss=f"{loss:.3f}", lr=f"{lr:.2e}", refresh=False)
                        timed.update(images=b, loss=loss, note=f"epoch {self.epoch + 1}/{self.epochs_planned}")
                        if cfg.log_every and self.global_step % cfg.log_every == 0:
                            now = time.perf_counter()
                            rate = (self.images_seen - mark[1]) / max(now - mark[0], 1e-9)
                            mark = (now, self.images_seen)
                            self._say(f"epoch {self.epoch + 1}/{self.epochs_planned}  step {self.global_step}/"
                                      f"{self.total_steps}  loss {loss:.4f}  lr {lr:.2e}  {rate:.1f} img/s")
                        interrupted = stop.received(self.dist)
                        over_time = cfg.time_budget is not None and time.perf_counter() - start_wall > cfg.time_budget
                        over_time = bool(broadcast_object(over_time, self.dist))
                        if cfg.save_every_steps and self.global_step % cfg.save_every_steps == 0 \
                                and self.step_in_epoch < n_steps:
                            self._account(t0)
                            t0 = time.perf_counter()
                            self.save()
                        if interrupted or over_time or self.global_step >= self.total_steps:
                            break
                    bar.close()
                    self._account(t0)
                    if interrupted is not None:
                        self.save()
                        break
                    self._end_epoch()
                    finished_epoch = self.step_in_epoch >= self.steps_per_epoch
                    if finished_epoch:
                        self.epoch += 1
                        self.step_in_epoch = 0
                        self.epoch_stats = {"loss_sum": 0.0, "correct": 0, "seen": 0, "train_time": 0.0}
                    self.save()
                    if over_time or not finished_epoch:
                        break
        finally:
            if log is not None:
                log.close()
        result = self._finish(interrupted)
        self.wall_time, self._session_start = result["wall_time_s"], None
        return result

    def _account(self, t0: float) -> None:
        dt = time.perf_counter() - t0
        self.train_time += dt
        self.epoch_stats["train_time"] += dt

    def _finish(self, interrupted: str | None) -> dict:
        cfg = self.config
        ev = self.last_eval
        if interrupted is None and ev is None:
            ev = self._evaluate("eval")
        peak, peak_kind = peak_memory_mb(self.device)
        session_wall = time.perf_counter() - self._session_start
        result = {
            "run_dir": str(self.run_dir),
            "model": cfg.model,
            "attn": cfg.attn,
            "data": cfg.data,
            "img_size": cfg.img_size,
            "epochs_completed": self.epoch,
            "steps": self.global_step,
            "interrupted": interrupted,
            "params": count_params(self.model),
            "train_time_s": self.train_time,
            "wall_time_s": self.wall_time + session_wall,
            "session_wall_time_s": session_wall,
            "images_per_s": self.images_seen / self.train_time if self.train_time > 0 else None,
            "peak_memory_mb": peak,
            "peak_memory_kind": peak_kind,
            "history": self.history,
            "eval_split": self.eval_split,
            "classes": [str(c) for c in self.classes],
        }
        if ev is not None:
            result.update(top1=ev["top1"], top5=ev["top5"], loss=ev["loss"], per_class=ev["per_class"],
                          confusion=ev["confusion"], eval_n=ev["n"])
        if self.dist.is_main and interrupted is None:
            meta = {"model": cfg.model, "attn": cfg.attn, "train_config": json.dumps(cfg.to_saved()),
                    "classes": json.dumps(result["classes"])}
            save_weights(self.model.state_dict(), self.run_dir / WEIGHTS_NAME, meta)
            if self.ema is not None:
                save_weights(self.ema.shadow, self.run_dir / EMA_WEIGHTS_NAME, meta)
        if self.dist.is_main:
            (self.run_dir / SUMMARY).write_text(json.dumps(result, indent=1) + "\n")
        barrier(self.dist)
        return result

    def close(self) -> None:
        """Leaves the process group (if this trainer created it) and restores the thread count."""
        cleanup(self.dist, self._prev_threads)


def train(config: TrainConfig | None = None, *, resume: str | Path | ResumePoint | None = None,
          allow_schedule_change: bool = False, **overrides) -> dict:
    """Trains one model and returns its final metrics.

    Args:
        config: a ``TrainConfig`` (default settings when None); ``overrides`` replace its fields.
        resume: a run directory or checkpoint file to continue from.
        allow_schedule_change: resume even when ``overrides`` change the learning-rate schedule (e.g. more
            ``epochs``); refused with a ValueError naming the setting otherwise (``Trainer``).

    Returns a dict with ``top1``, ``top5``, ``loss`` (test split; EMA weights when ``ema``), ``history`` (one
    row per epoch), ``images_per_s``, ``peak_memory_mb`` (+ ``peak_memory_kind``), ``params``,
    ``train_time_s``, ``wall_time_s`` (>= train time, both over every session), ``session_wall_time_s``,
    ``run_dir``, ``interrupted`` (signal name or None) and more.
    """
    if resume is not None and not isinstance(resume, ResumePoint):
        resume = read_resume(resume)
    if overrides:
        if config is not None:
            base = config.to_dict()
        elif resume is not None:
            base = saved_config(resume.state["config"])
        else:
            base = TrainConfig().to_dict()
        unknown = set(overrides) - set(base)
        if unknown:
            raise TypeError(f"{sorted(unknown)[0]}: not a TrainConfig field")
        config = TrainConfig.from_dict({**base, **overrides})
    trainer = Trainer(config, resume=resume, allow_schedule_change=allow_schedule_change)
    try:
        return trainer.fit()
    finally:
        trainer.close()
