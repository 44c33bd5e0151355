"""Shared test fixtures.

- ``nan_empty``: torch.empty / empty_like / Tensor.new_empty return NaN-filled floating tensors, so a
  kernel that leaves part of its output unwritten fails loudly (flash-linear-attention's practice).
- ``triton_interpreter``: runs test files marked ``triton`` in a subprocess with TRITON_INTERPRET=1,
  so the interpreter (which must be chosen before Triton kernels are defined) never leaks into this
  process. On a machine with CUDA those tests run for real in-process instead.
"""

from __future__ import annotations

import os
import subprocess
import sys
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


@pytest.fixture(scope="session")
def triton_interpreter():
    """run(*test_files, timeout=...): ``pytest -m triton`` on the files under TRITON_INTERPRET=1 in a subprocess;
    fails the calling test unless that run exits 0 with tests passed and none failed; returns the process."""

    def run(*files: str, timeout: float = 600.0) -> subprocess.CompletedProcess:
        env = dict(os.environ, TRITON_INTERPRET="1", CUDA_VISIBLE_DEVICES="")
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "triton", *files]
        proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
        summary = proc.stdout.strip().splitlines()[-1]
        assert " passed" in summary and "failed" not in summary and "error" not in summary, proc.stdout[-2000:]
        return proc

    return run
