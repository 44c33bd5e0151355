"""``laplacianformer demo``: accuracy at a fixed budget and cost per image against resolution, in one run.

1. **Accuracy.** ``laplacianformer_micro`` with Laplacian, Gaussian (SOFT's bandwidth, DESIGN.md §1.4) and
   PVTv2 spatial-reduction softmax attention trains on Fashion-MNIST under the resolution rule of the
   ablation protocol (``train.geometry``, DESIGN.md §7): 28 px, stem stride 2, so stage 1 is 14×14 = 196
   tokens ≥ 4 × 49 landmarks and the Nyström path is exercised. Recipe (``DEFAULTS``): 40,000 training
   images for one epoch, batch 128, AdamW lr 2e-3 with a 0.1-epoch warm-up, weight decay 0.01, no drop
   path, label smoothing, crop or flip; evaluated on all 10,000 test images.
2. **Cost** (``train.cost``): time and peak memory per image of the three backbones at 224–1024 px
   (stem stride 4, batch 1, one thread), forward and training step, round-robin.

Every training and the cost panel run as single-threaded subprocesses, ``jobs`` at a time (default 2, one
per core; longest first, the cost panel last, beside the last training), so each has its own peak resident
memory and its CPU seconds are read from ``wait4``. Writes into ``out``: one run directory per attention,
``cost/``, ``results.json``, ``results.md``, ``curves.png`` (training curves) and ``cost.png``;
``publish`` copies the last four into another directory (``docs/demo`` of the repository).
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from collections.abc import Sequence
from pathlib import Path

from ..layers.token_mixer import ATTENTIONS
from .cost import COST_JSON, COST_PNG, SIZES, cost_table, crossover, growth_exponents
from .geometry import MIN_TOKENS_PER_LANDMARK, check_geometry, geometry, in_chans_of
from .plots import plot_steps

MODEL = "laplacianformer_micro"
DEFAULTS = dict(
    data="fashion-mnist", img_size=28, model_kwargs={"stem_stride": 2}, train_subset=40000, test_subset=None,
    epochs=1, batch_size=128, lr=2e-3, warmup_epochs=0.1, weight_decay=0.01, drop_path=0.0, label_smoothing=0.0,
    random_crop=False, hflip=False, threads=1, seed=0,
)
"""The recipe. A probe of the Laplacian model (one thread, full 10,000-image test set): 40,000 training
images, 1 epoch, lr 2e-3 gave 85.95 % (seed 0) and 86.09 % (seed 1), where lr 3e-3 gave 84.70 / 84.54 %
and the full 60,000 images at lr 3e-3 85.53 % in 1.5x the time (README, "The demo")."""
QUICK = {**DEFAULTS, "train_subset": 512, "test_subset": 256, "batch_size": 64}
"""Smoke-test budget (seconds per variant; its numbers are not results)."""
COST = dict(sizes=list(SIZES), repeats=3, max_seconds=20.0, cap_s=30.0)
COST_QUICK = dict(sizes=[32, 64], repeats=1, max_seconds=2.0, cap_s=10.0)
RESULTS_FILES = ("results.json", "results.md", "curves.png", "cost.png")
# expected relative CPU cost per training (measured: softmax-SR ~20 % less than the Laplacian): longest first
_ORDER = {"gaussian": 0, "laplacian": 1, "softmax": 2}


def parse_attns(text: str | list | tuple) -> list[str]:
    """Comma-separated attention names (or a list) -> list; ValueError naming ``attns`` otherwise."""
    names = [a.strip() for a in text.split(",")] if isinstance(text, str) else [str(a).strip() for a in text]
    names = [a for a in names if a]
    if not names:
        raise ValueError(f"attns: expected one or more of {', '.join(ATTENTIONS)}, got {text!r}")
    bad = [a for a in names if a not in ATTENTIONS]
    if bad:
        raise ValueError(f"attns: unknown attention {bad[0]!r} (choose from {', '.join(ATTENTIONS)})")
    dupes = sorted({a for a in names if names.count(a) > 1})
    if dupes:
        raise ValueError(f"attns: {dupes[0]!r} given twice")
    return names


@dataclass
class Job:
    """One subprocess of the demo: its command, log file and, once finished, its accounting."""

    name: str
    cmd: list[str]
    log: Path
    proc: subprocess.Popen | None = None
    started: float = 0.0
    result: dict = field(default_factory=dict)


def run_jobs(jobs: list[Job], parallel: int, *, env: dict, report=None, poll_s: float = 0.5,
             heartbeat_s: float = 30.0) -> list[float]:
    """Runs ``jobs`` in list order, ``parallel`` at a time; fills each ``job.result`` with returncode,
    wall_s, cpu_s (user + system, from ``wait4``) and max_rss_mib. Returns the 1-minute load averages sampled
    while they ran. On an exception (KeyboardInterrupt) the running jobs get SIGTERM (a training run
    checkpoints and stops) and are waited for."""
    pending, running, loads = list(jobs), [], []
    last_beat = time.perf_counter()
    try:
        while pending or running:
            while pending and len(running) < parallel:
                job = pending.pop(0)
                job.log.parent.mkdir(parents=True, exist_ok=True)
                with open(job.log, "w") as log:
                    job.proc = subprocess.Popen(job.cmd, stdout=log, stderr=subprocess.STDOUT, env=env)
                job.started = time.perf_counter()
                running.append(job)
                if report:
                    report(f"started {job.name} (log: {job.log})")
            time.sleep(poll_s)
            loads.append(os.getloadavg()[0])
            for job in list(running):
                pid, status, usage = os.wait4(job.proc.pid, os.WNOHANG)
                if pid == 0:
                    continue
                job.proc.returncode = os.waitstatus_to_exitcode(status)
                job.result = dict(returncode=job.proc.returncode, wall_s=time.perf_counter() - job.started,
                                  cpu_s=usage.ru_utime + usage.ru_stime, max_rss_mib=usage.ru_maxrss / 1024)
                running.remove(job)
                if report:
                    report(f"finished {job.name}: exit {job.proc.returncode}, {job.result['wall_s']:.0f} s wall, "
                           f"{job.result['cpu_s']:.0f} CPU-s")
            if report and running and time.perf_counter() - last_beat > heartbeat_s:
                last_beat = time.perf_counter()
                report("running: " + ", ".join(f"{j.name} {_progress(j)}" for j in running))
    except BaseException:
        for job in running:
            job.proc.terminate()
        for job in running:
            job.proc.wait()
        raise
    return loads


def _progress(job: Job) -> str:
    """'step S' from the last line of a training run's log.jsonl, else the elapsed seconds."""
    path = job.log.parent / "log.jsonl"
    try:
        last = path.read_text().strip().splitlines()[-1]
        return f"step {json.loads(last)['step']}"
    except (OSError, IndexError, ValueError, KeyError):
        return f"{time.perf_counter() - job.started:.0f} s"


def train_command(attn: str, run_dir: Path, budget: dict, time_budget: float | None) -> list[str]:
    """``python -m laplacianformer train`` with every recipe field of ``budget`` as a flag."""
    cmd = [sys.executable, "-m", "laplacianformer", "train", "--attn", attn, "--model", MODEL,
           "--data", budget["data"], "--out", str(run_dir), "--img-size", str(budget["img_size"]),
           "--model-kwargs", json.dumps(budget["model_kwargs"]), "--epochs", str(budget["epochs"]),
           "--batch-size", str(budget["batch_size"]), "--lr", str(budget["lr"]),
           "--warmup-epochs", str(budget["warmup_epochs"]), "--weight-decay", str(budget["weight_decay"]),
           "--drop-path", str(budget["drop_path"]), "--label-smoothing", str(budget["label_smoothing"]),
           "--random-crop" if budget["random_crop"] else "--no-random-crop",
           "--hflip" if budget["hflip"] else "--no-hflip",
           "--threads", str(budget["threads"]), "--seed", str(budget["seed"]), "--no-progress"]
    for key in ("train_subset", "test_subset"):
        if budget[key] is not None:
            cmd += [f"--{key.replace('_', '-')}", str(budget[key])]
    if time_budget:
        cmd += ["--time-budget", str(time_budget)]
    return cmd


def cost_command(out: Path, cost: dict, threads: int, attns: Sequence[str]) -> list[str]:
    """The cost panel's subprocess: the demo's attentions at the panel's sizes."""
    return [sys.executable, "-m", "laplacianformer.train.cost", "--out", str(out), "--threads", str(threads),
            "--attns", ",".join(attns), "--sizes", *map(str, cost["sizes"]), "--repeats", str(cost["repeats"]),
            "--max-seconds", str(cost["max_seconds"]), "--cap-s", str(cost["cap_s"])]


def _macs(attn: str, img_size: int, in_chans: int, model_kwargs: dict) -> float | None:
    """Multiply-accumulates per image from the model registry's counter (None when it is unavailable)."""
    try:
        from ..models import create_model, model_info
    except ImportError:
        return None
    net = create_model(MODEL, num_classes=10, in_chans=in_chans, attn=attn, **model_kwargs)
    return float(model_info(net, img_size=img_size)["macs"])


def _softmax_queries_keys(img_size: int, in_chans: int, model_kwargs: dict) -> list[list[int]]:
    """Per attention layer of the spatial-reduction softmax model: [query tokens, key/value tokens]."""
    import torch

    from ..layers import SpatialReductionAttention
    from ..models import create_model

    net = create_model(MODEL, num_classes=10, in_chans=in_chans, attn="softmax", **model_kwargs).eval()
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


def _versions() -> dict:
    import platform

    from importlib import metadata

    import torch

    try:
        ours = metadata.version("laplacianformer")
    except metadata.PackageNotFoundError:
        ours = None
    out = dict(python=platform.python_version(), torch=torch.__version__, laplacianformer=ours)
    try:
        import numpy

        out["numpy"] = numpy.__version__
    except ImportError:
        pass
    return out


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "unknown"


def cost_rows(cells: list[dict]) -> list[dict]:
    """The cost cells merged per (size, attention): forward and train-step ms, CPU ms and peak MiB per image."""
    rows: dict[tuple, dict] = {}
    for c in cells:
        row = rows.setdefault((c["size"], c["attn"]), dict(size=c["size"], attn=c["attn"],
                                                            stage1_tokens=c.get("tokens_stage1")))
        prefix = "forward" if c["mode"] == "infer" else "train_step"
        if c.get("skipped"):
            row[f"{prefix}_skipped"] = c["skipped"]
            continue
        row.update({f"{prefix}_ms": c["ms_per_image"], f"{prefix}_cpu_ms": c["cpu_ms_per_image"],
                    f"{prefix}_peak_mib": c["peak_heap_mib"]})
        if c["mode"] == "train":
            row["activations_mib"] = c["activations_mib"]
        row["stage1_tokens"] = row.get("stage1_tokens") or c.get("tokens_stage1")
    return list(rows.values())


def accuracy_table(rows: list[dict]) -> str:
    head = ("| attention | top-1 (%) | top-5 (%) | test loss | params | MACs/image | train time (s) | CPU time (s) "
            "| train images/s | peak RSS (MiB) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        macs = f"{r['macs'] / 1e6:.1f}M" if r.get("macs") else "n/a"
        lines.append(f"| {r['attn']} | {100 * r['top1']:.2f} | {100 * r['top5']:.2f} | {r['loss']:.3f} "
                     f"| {r['params'] / 1e6:.3f}M | {macs} | {r['train_time_s']:.0f} | {r['cpu_time_s']:.0f} "
                     f"| {r['images_per_s']:.0f} | {r['peak_memory_mb']:.0f} |")
    return head + "\n".join(lines) + "\n"


def key_ratios(cells: list[dict], attns: list[str]) -> dict:
    """At the largest size every attention measured: each one's time and peak memory over softmax's, and the
    crossover sizes (smallest measured size from which it is no slower / no larger than softmax; memory within
    1 % counts as equal)."""
    out: dict = {}
    if "softmax" not in attns:
        return out
    ok = [c for c in cells if not c.get("skipped")]
    for attn in attns:
        if attn == "softmax":
            continue
        entry = {}
        for mode in ("infer", "train"):
            both = {c["size"] for c in ok if c["mode"] == mode and c["attn"] == attn} & \
                   {c["size"] for c in ok if c["mode"] == mode and c["attn"] == "softmax"}
            if not both:
                continue
            size = max(both)
            a = next(c for c in ok if (c["size"], c["mode"], c["attn"]) == (size, mode, attn))
            b = next(c for c in ok if (c["size"], c["mode"], c["attn"]) == (size, mode, "softmax"))
            def div(key):
                return a[key] / b[key] if a.get(key) and b.get(key) else None

            entry[mode] = dict(
                size=size, time=div("ms_per_image"), cpu_time=div("cpu_ms_per_image"), peak_heap=div("peak_heap_mib"),
                activations=div("activations_mib"),
                crossover_time=crossover(cells, attn, mode=mode, field="ms_per_image"),
                crossover_cpu_time=crossover(cells, attn, mode=mode, field="cpu_ms_per_image"),
                crossover_peak_heap=crossover(cells, attn, mode=mode, field="peak_heap_mib", tol=0.01),
            )
        out[attn] = entry
    return out


def _ratio_lines(ratios: dict, sizes: list[int]) -> str:
    names = {"infer": "forward", "train": "training step"}
    span = f"{min(sizes)}–{max(sizes)}²" if sizes else "the measured sizes"
    lines = []
    for attn, entry in ratios.items():
        for mode, r in entry.items():
            def x(v):
                return f"{v:.2f}×" if v else "n/a"

            def cross(key):
                return f"from {r[key]}² on" if r[key] else f"never in {span}"

            act = f", activations {x(r.get('activations'))}" if r.get("activations") else ""
            lines.append(f"- {attn} / softmax-SR, {names[mode]} at {r['size']}²: CPU time {x(r['cpu_time'])}, wall "
                         f"{x(r['time'])}, peak heap {x(r['peak_heap'])}{act}. "
                         f"No slower: {cross('crossover_cpu_time')} "
                         f"(CPU time), {cross('crossover_time')} (wall); no more memory: "
                         f"{cross('crossover_peak_heap')}.")
    return "\n".join(lines) + "\n"


def idle_wall_estimate(cpu_seconds: list[float], jobs: int) -> float:
    """Wall seconds the jobs would take on ``jobs`` idle cores: longest first, each to the least-loaded core
    (what ``run_jobs`` does with the demo's order), one CPU-second per second."""
    slots = [0.0] * max(1, jobs)
    for c in sorted(cpu_seconds, reverse=True):
        slots[slots.index(min(slots))] += c
    return max(slots)


def derive(result: dict) -> dict:
    """Fills the fields computed from the measurements (cost ratios, crossovers, growth exponents, idle-machine
    estimate) into ``result``; used by ``run_demo`` and by ``rerender`` on a saved results.json."""
    s = result["settings"]
    cpu = [r["cpu_time_s"] for r in result["rows"]]
    if result.get("cost"):
        c = result["cost"]
        c["rows"] = cost_rows(c["cells"])
        c["key_ratios"] = key_ratios(c["cells"], [r["attn"] for r in result["rows"]])
        c["growth_exponents_cpu"] = growth_exponents(c["cells"], "cpu_ms_per_image")
        c["growth_exponents_peak_heap"] = growth_exponents(c["cells"], "peak_heap_mib")
        cpu.append(c["cpu_s"])
    s["idle_wall_estimate_s"] = idle_wall_estimate(cpu, s["jobs"])
    return result


def rerender(out: str | Path) -> str:
    """Recomputes the derived fields of ``out``/results.json and rewrites it and results.md (no rerun)."""
    out = Path(out)
    result = derive(json.loads((out / "results.json").read_text()))
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = results_markdown(result)
    (out / "results.md").write_text(md)
    return md


def _clear_run_dir(path: Path) -> None:
    """Removes an earlier demo run directory (recognised by its files) so no stale file survives."""
    if path.is_dir() and any((path / n).exists() for n in ("train_config.json", "summary.json", "log.jsonl",
                                                          COST_JSON)):
        shutil.rmtree(path)


def run_demo(out="runs/demo", attns=ATTENTIONS, *, quick: bool = False, jobs: int = 2, cost: bool = True,
             publish: str | Path | None = None, time_budget: float | None = None, progress: bool = True,
             cost_sizes: list[int] | None = None, **overrides) -> dict:
    """Trains and evaluates each attention, measures the cost panel; returns the results (also written to
    ``out``). ``overrides``: recipe fields of ``DEFAULTS`` (None: keep); ``model_kwargs`` is merged onto the
    recipe's. ValueError (naming the argument) before anything runs when an argument is invalid."""
    attns = parse_attns(attns)
    budget = {**(QUICK if quick else DEFAULTS)}
    unknown = sorted(set(overrides) - set(budget))
    if unknown:
        raise TypeError(f"{unknown[0]}: not a demo recipe field (expected one of {sorted(budget)})")
    for key, value in overrides.items():
        if value is None:
            continue
        budget[key] = {**budget["model_kwargs"], **value} if key == "model_kwargs" else value
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ValueError(f"jobs: expected an integer >= 1, got {jobs!r}")
    cost_cfg = dict(COST_QUICK if quick else COST)
    if cost_sizes:
        cost_cfg["sizes"] = sorted(cost_sizes)
    # the training flags, checked as the train command will check them, before anything runs
    from .config import TrainConfig

    for attn in attns:
        TrainConfig(model=MODEL, attn=attn, **budget).validate()
    rec = dict(model=MODEL, **budget)
    geom = geometry(rec)
    check_geometry(geom, rec)
    in_chans = in_chans_of(rec)

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    say = (lambda m: print(f"[demo] {m}", file=sys.stderr, flush=True)) if progress else None
    order = sorted(attns, key=lambda a: _ORDER.get(a, 0))
    job_list = []
    for attn in order:
        _clear_run_dir(out / attn)
        job_list.append(Job(attn, train_command(attn, out / attn, budget, time_budget), out / attn / "train.log"))
    if cost:
        _clear_run_dir(out / "cost")
        job_list.append(Job("cost", cost_command(out / "cost", cost_cfg, budget["threads"], order),
                            out / "cost" / "cost.log"))
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS=str(budget["threads"]), MKL_NUM_THREADS=str(budget["threads"]))
    src = str(Path(__file__).resolve().parents[2])  # the children import this copy of the package
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
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
    rows, step_logs = [], {}
    for attn in attns:
        run_dir = out / attn
        summary = json.loads((run_dir / "summary.json").read_text())
        res = next(j for j in job_list if j.name == attn).result
        row = {k: summary.get(k) for k in ("attn", "top1", "top5", "loss", "params", "images_per_s", "train_time_s",
                                           "steps", "eval_n", "run_dir")}
        row.update(cpu_time_s=res["cpu_s"], wall_time_s=res["wall_s"], peak_memory_mb=res["max_rss_mib"],
                   peak_memory_kind="process peak RSS (wait4 ru_maxrss)",
                   macs=_macs(attn, budget["img_size"], in_chans, budget["model_kwargs"]))
        rows.append(row)
        lines = (run_dir / "log.jsonl").read_text().splitlines()
        step_logs[attn] = dict(steps=[json.loads(x) for x in lines if x.strip()], top1=row["top1"],
                               batch_size=budget["batch_size"])
    cost_block = None
    if cost:
        raw = json.loads((out / "cost" / COST_JSON).read_text())
        cells = raw["cells"]
        cost_block = dict(settings=raw["settings"], cells=cells,
                          cpu_s=next(j for j in job_list if j.name == "cost").result["cpu_s"])
        shutil.copyfile(out / "cost" / COST_PNG, out / COST_PNG)
    total_wall = time.perf_counter() - t0
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    total_cpu = (time.process_time() - c0) + (children.ru_utime - children0.ru_utime) \
        + (children.ru_stime - children0.ru_stime)
    run_cfg = json.loads((out / attns[0] / "train_config.json").read_text())
    settings = dict(
        quick=quick, model=MODEL, recipe={k: v for k, v in run_cfg.items() if k not in ("attn", "out", "progress")},
        protocol=dict(img_size=budget["img_size"], stem_stride=budget["model_kwargs"].get("stem_stride"),
                      stage1_grid=geom["stage1_grid"], stage1_tokens=geom["stage1_tokens"], landmarks=geom["landmarks"],
                      tokens_per_landmark=geom["stage1_tokens"] / geom["landmarks"],
                      min_tokens_per_landmark=MIN_TOKENS_PER_LANDMARK, head_dim=geom["head_dim"],
                      softmax_queries_keys=_softmax_queries_keys(budget["img_size"], in_chans, budget["model_kwargs"])
                      if "softmax" in attns else None),
        threads=budget["threads"], jobs=jobs, time_budget=time_budget, cost=cost_cfg if cost else None,
        commands={j.name: " ".join(j.cmd[1:]) for j in job_list},
        total_wall_time_s=total_wall, total_cpu_time_s=total_cpu,
        load_average_before=list(load_before), load_average_after=list(os.getloadavg()),
        load_average_mean_during=sum(loads) / len(loads) if loads else None,
        cpu=_cpu_model(), cpu_count=os.cpu_count(), versions=_versions(),
        date_utc=time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    )
    result = derive(dict(settings=settings, rows=rows, cost=cost_block))
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = results_markdown(result)
    (out / "results.md").write_text(md)
    plot_steps(step_logs, out / "curves.png",
               title=f"{MODEL} on {budget['data']} ({budget['img_size']} px, {run_cfg.get('epochs')} epoch(s))")
    if publish is not None:
        dest = Path(publish)
        dest.mkdir(parents=True, exist_ok=True)
        for name in RESULTS_FILES:
            if (out / name).exists():
                shutil.copyfile(out / name, dest / name)
    print(md)
    return result


def results_markdown(result: dict) -> str:
    """results.md: what ran, the accuracy table, the cost table and its key ratios."""
    s, rows, cost = result["settings"], result["rows"], result["cost"]
    p, r = s["protocol"], s["recipe"]
    n_train = rows[0].get("steps", 0) * r["batch_size"] if rows else 0
    load = s.get("load_average_mean_during")
    load_note = (f"Mean 1-minute load average during the run: {load:.1f} on {s['cpu_count']} CPUs"
                 + (" (a busy machine: wall times are longer than on an idle one; CPU seconds are the steadier "
                    "measure)." if load and load > 1.5 * s["cpu_count"] else "."))
    keys = p.get("softmax_queries_keys")
    keys_note = ("; softmax-SR (PVTv2 reductions 8, 4, 2, 1) attends, per layer, queries → keys: "
                 + ", ".join(f"{q} → {k}" for q, k in keys) if keys else "")
    text = [
        f"# Demo results{' (quick smoke test: not results)' if s['quick'] else ''}\n",
        f"`laplacianformer demo` on {s['date_utc']}: {s['model']}, {r['data']} at {p['img_size']} px, stem stride "
        f"{p['stem_stride']}: stage 1 is {p['stage1_grid'][0]}×{p['stage1_grid'][1]} = {p['stage1_tokens']} tokens "
        f"for {p['landmarks']} landmarks ({p['tokens_per_landmark']:.0f} per landmark, the protocol asks "
        f"≥ {p['min_tokens_per_landmark']}), so the Nyström path is exercised{keys_note}. "
        f"Recipe: {r['epochs']} epoch(s) over {r.get('train_subset') or 'all'} training images "
        f"(~{n_train} seen), batch {r['batch_size']}, AdamW lr {r['lr']:g}, warm-up {r['warmup_epochs']:g} epoch, "
        f"weight decay {r['weight_decay']:g}, drop path {r['drop_path']:g}, label smoothing {r['label_smoothing']:g}, "
        f"crop {'on' if r['random_crop'] else 'off'}, flip {'on' if r['hflip'] else 'off'}, seed {r['seed']}; "
        f"test on {rows[0].get('eval_n') if rows else '?'} images. {s['jobs']} job(s) at a time, {s['threads']} "
        f"thread(s) each, {s['cpu']} ({s['cpu_count']} CPUs), torch {s['versions']['torch']}.\n",
        f"Total wall time {s['total_wall_time_s']:.0f} s; CPU time of all processes {s['total_cpu_time_s']:.0f} s. "
        f"{load_note} On {s['jobs']} idle cores the jobs' CPU seconds would take about "
        f"{s['idle_wall_estimate_s']:.0f} s of wall time (longest first, each on the least-loaded core; an "
        f"estimate, not a measurement).\n",
        "## Accuracy at this budget\n",
        accuracy_table(rows),
        "Train time: the training loop's own clock; CPU time: the whole subprocess (start-up, data, training, "
        "evaluation); peak RSS: the subprocess's resident high-water mark.\n",
    ]
    if cost:
        cs = cost["settings"]
        text += [
            "## Cost per image against resolution\n",
            f"{cs['model']} with stem stride {cs['model_kwargs'].get('stem_stride', 4)}, batch 1, {cs['threads']} "
            f"thread(s), attentions round-robin ({cs['repeats']} rounds, median); measured beside the last training "
            f"on the other core. Peak MiB: the C heap in use (mallinfo2 sampled after every aten op) above the level "
            f"before the call; activations: the storages autograd saves for the backward. The training step is "
            f"forward + loss + backward (no optimiser step). Cost panel: {cs['wall_s']:.0f} s wall, "
            f"{cs['cpu_s']:.0f} CPU-s.\n",
            cost_table(cost["cells"]),
            "Relative to softmax-SR at the largest measured size:\n",
            _ratio_lines(cost["key_ratios"], cost["settings"]["sizes"]) if cost["key_ratios"] else "(no softmax row)\n",
            "Growth of CPU time per image with the stage-1 tokens (least-squares exponent over the measured sizes; "
            "1 is linear, 2 quadratic): " + "; ".join(
                f"{a} forward {e.get('infer', float('nan')):.2f}, training step {e.get('train', float('nan')):.2f}"
                for a, e in cost["growth_exponents_cpu"].items()) + ".\n",
        ]
    return "\n".join(text)
