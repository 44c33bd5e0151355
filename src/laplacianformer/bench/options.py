"""The options every timing benchmark shares (--device, --threads, --retain-heap, --out/--publish) and
what they do before the timing starts."""

from __future__ import annotations

import argparse
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from .allocator import allocator_setting, reexec_with_retained_heap
from .output import add_output_options, output_stem


def add_timing_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (CPU)")
    parser.add_argument("--retain-heap", action="store_true",
                        help="rerun with glibc keeping freed memory mapped (steady-state times, no page-fault lottery)")
    add_output_options(parser)


def start_timing_run(args: argparse.Namespace, module: str, argv: Sequence[str] | None) -> tuple[float, float, float]:
    """Applies the shared options before timing: reruns ``python -m module`` under the retained-heap
    allocator for --retain-heap, records ``args.allocator``, sets the thread count. Returns the load
    average before."""
    if args.retain_heap:
        reexec_with_retained_heap(module, argv)
    args.allocator = allocator_setting()
    if args.threads:
        torch.set_num_threads(args.threads)
    return os.getloadavg()


def results_stem(args: argparse.Namespace, name: str) -> Path:
    """Where a timing benchmark writes: stem ``<name>_<device type>[_retain]`` (``output.output_stem``)."""
    suffix = "_retain" if args.allocator == "glibc-retain" else ""
    return output_stem(args, name, f"{name}_{torch.device(args.device).type}{suffix}")
