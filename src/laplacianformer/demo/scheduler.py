"""The demo's job scheduler: subprocesses run ``parallel`` at a time, each with its own accounting (wall
seconds, CPU seconds and peak resident memory from ``wait4``), and the wall time the same jobs would take on
idle cores."""

from __future__ import annotations

import json
import os
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


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


def idle_wall_estimate(cpu_seconds: list[float], jobs: int) -> float:
    """Wall seconds the jobs would take on ``jobs`` idle cores: longest first, each to the least-loaded core
    (what ``run_jobs`` does with the demo's order), one CPU-second per second."""
    slots = [0.0] * max(1, jobs)
    for c in sorted(cpu_seconds, reverse=True):
        slots[slots.index(min(slots))] += c
    return max(slots)
