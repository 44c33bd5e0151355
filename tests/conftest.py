"""Shared test fixtures.

- ``nan_empty``: torch.empty / empty_like / Tensor.new_empty return NaN-filled floating tensors, so a
  kernel that leaves part of its output unwritten fails loudly (flash-linear-attention's practice).
- ``triton_interpreter``: runs test files marked ``triton`` in a subprocess with TRITON_INTERPRET=1,
  so the interpreter (which must be chosen before Triton kernels are defined) never leaks into this
  process. On a machine with CUDA those tests run for real in-process instead. The runs the collected tests
  ask for (their ``triton_interpreter(...)`` calls, read from their source) start when collection ends, one
  at a time in a background thread, so they overlap the in-process tests (one after another, they took about
  40 % of the suite's time on two cores); each test then waits for its run and judges it. A run no test
  announced runs when asked.
"""

from __future__ import annotations

import ast
import inspect
import os
import subprocess
import sys
import textwrap
import threading
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]


def _poisoned(fn):
    def wrapper(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, torch.Tensor) and out.is_floating_point() and "out" not in kwargs:
            out.fill_(float("nan"))
        return out

    return wrapper


@pytest.fixture
def nan_empty(monkeypatch):
    """Fresh torch.empty tensors hold NaN instead of leftover memory."""
    monkeypatch.setattr(torch, "empty", _poisoned(torch.empty))
    monkeypatch.setattr(torch, "empty_like", _poisoned(torch.empty_like))
    monkeypatch.setattr(torch.Tensor, "new_empty", _poisoned(torch.Tensor.new_empty))
    yield


def triton_runs_here() -> bool:
    """True when Triton kernels can run in this process: CUDA present, or TRITON_INTERPRET set."""
    interpreted = os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")
    return torch.cuda.is_available() or interpreted


def _interpreter_command(files: tuple[str, ...]) -> tuple[list[str], dict]:
    env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
    return [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "triton", *files], env


class _InterpreterRuns:
    """The interpreter runs of the collected tests, started one at a time in a background thread; ``result``
    waits for one (a CompletedProcess, or the exception its run raised)."""

    def __init__(self, jobs: list[tuple[tuple[str, ...], float]]):
        self.jobs = dict(jobs)
        self._results: dict[tuple[str, ...], object] = {}
        self._done = threading.Condition()
        self._proc: subprocess.Popen | None = None
        self._stopped = False
        threading.Thread(target=self._work, daemon=True, name="triton-interpreter-runs").start()

    def _work(self) -> None:
        for files, timeout in self.jobs.items():
            cmd, env = _interpreter_command(files)
            with self._done:
                if self._stopped:
                    return
                try:
                    self._proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                                  stderr=subprocess.PIPE, text=True)
                except OSError as exc:
                    self._results[files] = exc
                    self._done.notify_all()
                    continue
            try:
                out, err = self._proc.communicate(timeout=timeout)
                result: object = subprocess.CompletedProcess(cmd, self._proc.returncode, out, err)
            except subprocess.TimeoutExpired as exc:
                self._proc.kill()
                self._proc.communicate()
                result = exc
            except Exception as exc:  # the waiting test raises it, rather than waiting forever
                result = exc
            with self._done:
                self._results[files] = result
                self._done.notify_all()

    def result(self, files: tuple[str, ...]) -> object:
        with self._done:
            self._done.wait_for(lambda: files in self._results or self._stopped)
            return self._results.get(files)

    def stop(self) -> None:
        with self._done:
            self._stopped = True
            if self._proc is not None and self._proc.poll() is None:
                self._proc.kill()
            self._done.notify_all()


_BACKGROUND: _InterpreterRuns | None = None


def _announced_run(item) -> tuple[tuple[str, ...], float] | None:
    """The (files, timeout) of the one ``triton_interpreter(...)`` call in a test's source, when its arguments
    are literals; else None."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(item.function)))
    except (OSError, TypeError, SyntaxError):
        return None
    calls = [n for n in ast.walk(tree)
             if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "triton_interpreter"]
    if len(calls) != 1:
        return None
    try:
        files = tuple(ast.literal_eval(a) for a in calls[0].args)
        timeout = {k.arg: ast.literal_eval(k.value) for k in calls[0].keywords}.get("timeout", 600.0)
    except (ValueError, TypeError, SyntaxError):
        return None
    return files, float(timeout)


def pytest_collection_finish(session) -> None:
    """Starts the interpreter runs of the collected tests in the background (only where they would run: no
    CUDA, no interpreter in this process, Triton installed)."""
    global _BACKGROUND
    import importlib.util

    if triton_runs_here() or importlib.util.find_spec("triton") is None or session.config.option.collectonly:
        return
    jobs = [_announced_run(item) for item in session.items if "triton_interpreter" in getattr(item, "fixturenames", ())]
    jobs = [job for job in jobs if job is not None]
    if jobs:
        _BACKGROUND = _InterpreterRuns(jobs)


def pytest_sessionfinish(session, exitstatus) -> None:
    if _BACKGROUND is not None:
        _BACKGROUND.stop()


@pytest.fixture(scope="session")
def triton_interpreter():
    """run(*test_files, timeout=...): ``pytest -m triton`` on the files under TRITON_INTERPRET=1 in a subprocess
    (the background run started for it, when the test announced it); fails the calling test unless that run
    exits 0 with tests passed and none failed; returns the process."""

    def run(*files: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        if _BACKGROUND is not None and files in _BACKGROUND.jobs:
            proc = _BACKGROUND.result(files)
            if isinstance(proc, BaseException):
                raise proc
            assert proc is not None, "the background interpreter run was stopped"
        else:
            cmd, env = _interpreter_command(files)
            proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        summary = proc.stdout.strip().splitlines()[-1]
        assert " passed" in summary and "failed" not in summary and "error" not in summary, proc.stdout[-2000:]
        return proc

    return run
