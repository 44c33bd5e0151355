"""What a measurement depends on: the CPU, cores and threads, library versions, the GPU."""

from __future__ import annotations

import os
import platform
from importlib import metadata

import torch


def cpu_model() -> str:
    """CPU model name from /proc/cpuinfo (platform.processor() elsewhere)."""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(dist: str) -> str | None:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def versions() -> dict:
    """Python, torch, numpy and this package's versions (None where not installed as a distribution)."""
    return dict(python=platform.python_version(), torch=torch.__version__, laplacianformer=_version("laplacianformer"),
                numpy=_version("numpy"))


def machine_info() -> dict:
    """CPU, cores, torch threads, library versions and the GPU if any."""
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "affinity_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda_available": torch.cuda.is_available(),
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
    }
