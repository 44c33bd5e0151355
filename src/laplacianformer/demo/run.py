"""``laplacianformer demo``: accuracy at a fixed budget and cost per image against resolution, in one run.

1. **Accuracy.** ``laplacianformer_micro`` with Laplacian, Gaussian (SOFT's bandwidth, DESIGN.md §1.4) and
   PVTv2 spatial-reduction softmax attention trains on Fashion-MNIST under the resolution rule of the
   ablation protocol (``train.geometry``, DESIGN.md §7); the recipe is ``recipe.DEFAULTS``.
2. **Cost** (``bench.model_cost``): time and peak memory per image of the three backbones at 224–1024 px
   (stem stride 4, batch 1, one thread), forward and training step, round-robin.

Every training and the cost panel run as single-threaded subprocesses (``scheduler``), ``jobs`` at a time
(default 2, one per core; longest first, the cost panel last, beside the last training), so each has its
own peak resident memory and its CPU seconds are read from ``wait4``. Writes into ``out``: one run
directory per attention, ``cost/``, ``results.json``, ``results.md`` (``report``), ``curves.png`` (training
curves) and ``cost.png``; ``publish`` copies the last four into another directory (e.g. ``docs/demo`` of
a checkout), given explicitly.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time
from pathlib import Path

from ..bench.machine import cpu_model, versions
from ..bench.process import package_env
from ..train.geometry import MIN_TOKENS_PER_LANDMARK, check_geometry, geometry, in_chans_of, model_kwargs_for
from ..train.plots import plot_steps
from .recipe import MODEL, ORDER, ROWS, budget_of, cost_command, cost_of, parse_attns, row_attention, train_command
from .report import derive, results_markdown
from .scheduler import Job, run_jobs

RESULTS_FILES = ("results.json", "results.md", "curves.png", "cost.png")
COST_STEM = Path("cost") / "cost"
"""The cost panel's files under ``out``: cost/cost.json, .md, .png."""


def _macs(row: str, img_size: int, in_chans: int, model_kwargs: dict) -> float | None:
    """Multiply-accumulates per image of the row's model from the model registry's counter (None when it is
    unavailable)."""
    try:
        from ..models import create_model, model_info
    except ImportError:
        return None
    attn, preset = row_attention(row)
    net = create_model(MODEL, num_classes=10, in_chans=in_chans, attn=attn, attn_preset=preset,
                       **model_kwargs_for(model_kwargs, img_size))
    return float(model_info(net, img_size=img_size)["macs"])


def _softmax_queries_keys(img_size: int, in_chans: int, model_kwargs: dict) -> list[list[int]]:
    """Per attention layer of the spatial-reduction softmax model: [query tokens, key/value tokens]."""
    import torch

    from ..layers import SpatialReductionAttention
    from ..models import create_model

    net = create_model(MODEL, num_classes=10, in_chans=in_chans, attn="softmax",
                       **model_kwargs_for(model_kwargs, img_size)).eval()
    pairs: list[list[int]] = []
    hooks = []
    for m in net.modules():
        if isinstance(m, SpatialReductionAttention):
            hooks.append(m.register_forward_pre_hook(lambda mod, a: pairs.append([a[0].shape[1], a[0].shape[1]])))
            if m.norm is not None:  # the keys are the reduced grid's tokens, after its LayerNorm
                hooks.append(m.norm.register_forward_hook(lambda mod, a, out: pairs[-1].__setitem__(1, out.shape[1])))
    with torch.no_grad():
        net(torch.zeros(1, in_chans, img_size, img_size))
    for h in hooks:
        h.remove()
    return pairs




def _clear_run_dir(path: Path) -> None:
    """Removes an earlier demo run directory (recognised by its files) so no stale file survives."""
    if path.is_dir() and any((path / n).exists() for n in ("train_config.json", "summary.json", "log.jsonl",
                                                          COST_STEM.name + ".json")):
        shutil.rmtree(path)


def _plan(out: Path, attns: list[str], budget: dict, cost_cfg: dict | None, time_budget: float | None) -> list[Job]:
    """The jobs, longest first (``recipe.ORDER``), the cost panel last; earlier run directories cleared."""
    order = sorted(attns, key=lambda a: ORDER.get(a, 0))
    jobs = []
    for attn in order:
        _clear_run_dir(out / attn)
        jobs.append(Job(attn, train_command(attn, out / attn, budget, time_budget), out / attn / "train.log"))
    if cost_cfg is not None:
        _clear_run_dir(out / COST_STEM.parent)
        jobs.append(Job("cost", cost_command(out / COST_STEM, cost_cfg, budget["threads"], order),
                        out / COST_STEM.parent / "cost.log"))
    return jobs


def _accuracy_rows(out: Path, attns: list[str], jobs: list[Job], budget: dict, in_chans: int) -> tuple[list, dict]:
    """One row per attention (its summary.json and its job's accounting) and the training curves' step logs."""
    rows, step_logs = [], {}
    for attn in attns:
        run_dir = out / attn
        summary = json.loads((run_dir / "summary.json").read_text())
        res = next(j for j in jobs if j.name == attn).result
        row = {k: summary.get(k) for k in ("attn", "top1", "top5", "loss", "params", "images_per_s", "train_time_s",
                                           "steps", "eval_n", "run_dir")}
        row.update(attn=attn, attn_preset=row_attention(attn)[1])  # the row's name (a preset row's included)
        row.update(cpu_time_s=res["cpu_s"], wall_time_s=res["wall_s"], peak_memory_mb=res["max_rss_mib"],
                   peak_memory_kind="process peak RSS (wait4 ru_maxrss)",
                   macs=_macs(attn, budget["img_size"], in_chans, budget["model_kwargs"]))
        rows.append(row)
        lines = (run_dir / "log.jsonl").read_text().splitlines()
        step_logs[attn] = dict(steps=[json.loads(x) for x in lines if x.strip()], top1=row["top1"],
                               batch_size=budget["batch_size"])
    return rows, step_logs


def _cost_block(out: Path, jobs: list[Job]) -> dict:
    """The cost panel's settings and cells (its cost.json) and its CPU seconds; cost.png copied into ``out``."""
    raw = json.loads((out / COST_STEM).with_suffix(".json").read_text())
    shutil.copyfile((out / COST_STEM).with_suffix(".png"), out / "cost.png")
    return dict(settings=raw["settings"], cells=raw["cells"],
                cpu_s=next(j for j in jobs if j.name == "cost").result["cpu_s"])


def _protocol(budget: dict, geom: dict, attns: list[str], in_chans: int) -> dict:
    """The resolution facts of the run: stage-1 grid, landmarks, tokens per landmark, softmax's keys."""
    return dict(img_size=budget["img_size"],
                stem_stride=model_kwargs_for(budget["model_kwargs"], budget["img_size"]).get("stem_stride"),
                stage1_grid=geom["stage1_grid"], stage1_tokens=geom["stage1_tokens"], landmarks=geom["landmarks"],
                tokens_per_landmark=geom["stage1_tokens"] / geom["landmarks"],
                min_tokens_per_landmark=MIN_TOKENS_PER_LANDMARK, head_dim=geom["head_dim"],
                softmax_queries_keys=_softmax_queries_keys(budget["img_size"], in_chans, budget["model_kwargs"])
                if "softmax" in attns else None)


def _publish(out: Path, dest: str | Path) -> None:
    """Copies the results files of ``out`` into ``dest`` (created)."""
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    for name in RESULTS_FILES:
        if (out / name).exists():
            shutil.copyfile(out / name, dest / name)


def run_demo(out="runs/demo", attns=ROWS, *, quick: bool = False, jobs: int = 2, cost: bool = True,
             publish: str | Path | None = None, time_budget: float | None = None, progress: bool = True,
             cost_sizes: list[int] | None = None, **overrides) -> dict:
    """Trains and evaluates each attention, measures the cost panel; returns the results (also written to
    ``out``). ``overrides``: recipe fields of ``recipe.DEFAULTS`` (None: keep); ``model_kwargs`` is merged onto
    the recipe's. ValueError (naming the argument) before anything runs when an argument is invalid."""
    from ..train.config import TrainConfig

    attns = parse_attns(attns)
    budget = budget_of(quick, overrides)
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected an integer >= 1, got {jobs!r}")
    cost_cfg = cost_of(quick, cost_sizes) if cost else None
    for row in attns:  # the training flags, checked as the train command will check them, before anything runs
        attn, preset = row_attention(row)
        TrainConfig(model=MODEL, attn=attn, attn_preset=preset, **budget).validate()
    rec = dict(model=MODEL, **budget)
    geom = geometry(rec)
    check_geometry(geom, rec)
    in_chans = in_chans_of(rec)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda m: print(f"[demo] {m}", file=sys.stderr, flush=True)) if progress else None
    job_list = _plan(out, attns, budget, cost_cfg, time_budget)
    threads = str(budget["threads"])
    env = package_env(OMP_NUM_THREADS=threads, MKL_NUM_THREADS=threads)
    if say:
        say(f"{len(attns)} trainings + {'cost panel' if cost else 'no cost panel'}, {jobs} at a time, "
            f"{budget['threads']} thread(s) each; stage 1 {geom['stage1_grid'][0]}×{geom['stage1_grid'][1]} = "
            f"{geom['stage1_tokens']} tokens, {geom['landmarks']} landmarks")
    load_before = os.getloadavg()
    children0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0, c0 = time.perf_counter(), time.process_time()
    loads = run_jobs(job_list, jobs, env=env, report=say)
    failed = [j for j in job_list if j.result.get("returncode") != 0]
    if failed:
        j = failed[0]
        tail = j.log.read_text()[-2000:] if j.log.exists() else ""
        raise RuntimeError(f"demo: {j.name} failed with exit status {j.result.get('returncode')} "
                           f"(log {j.log}):\n{tail}")
    rows, step_logs = _accuracy_rows(out, attns, job_list, budget, in_chans)
    cost_block = _cost_block(out, job_list) if cost else None
    total_wall = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = (time.process_time() - c0) + (children.ru_utime - children0.ru_utime) \
        + (children.ru_stime - children0.ru_stime)
    run_cfg = json.loads((out / attns[0] / "train_config.json").read_text())
    settings = dict(
        quick=quick, model=MODEL, recipe={k: v for k, v in run_cfg.items() if k not in ("attn", "out", "progress")},
        protocol=_protocol(budget, geom, attns, in_chans),
        threads=budget["threads"], jobs=jobs, time_budget=time_budget, cost=cost_cfg,
        commands={j.name: " ".join(j.cmd[1:]) for j in job_list},
        total_wall_time_s=total_wall, total_cpu_time_s=total_cpu,
        load_average_before=list(load_before), load_average_after=list(os.getloadavg()),
        load_average_mean_during=sum(loads) / len(loads) if loads else None,
        cpu=cpu_model(), cpu_count=os.cpu_count(), versions=versions(),
        date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    result = derive(dict(settings=settings, rows=rows, cost=cost_block))
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = results_markdown(result)
    (out / "results.md").write_text(md)
    plot_steps(step_logs, out / "curves.png",
               title=f"{MODEL} on {budget['data']} ({budget['img_size']} px, {run_cfg.get('epochs')} epoch(s))")
    if publish is not None:
        _publish(out, publish)
    print(md)
    return result
