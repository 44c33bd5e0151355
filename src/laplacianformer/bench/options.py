"""The options every timing benchmark shares (--device, --threads, --retain-heap, --out/--publish) and
what they do before the timing starts; --model / --batch and --repeats / --max-seconds, for the benchmarks
that time one backbone or time rounds; --autocast, for the benchmarks that time a model under autocast."""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence
from pathlib import Path

import torch

from ..cmdline import positive_float, positive_int
from .allocator import allocator_setting, reexec_with_retained_heap
from .output import add_output_options, output_stem
from .report import write_json


def add_timing_options(parser: argparse.ArgumentParser, *, threads: int | None = None) -> None:
    """--device, --threads (``threads``: this benchmark's default; None leaves torch's), --retain-heap and the
    output options."""
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--threads", type=int, default=threads, help="torch.set_num_threads (CPU)")
    parser.add_argument("--retain-heap", action="store_true",
                        help="rerun with glibc keeping freed memory mapped (steady-state times, no page-fault lottery)")
    add_output_options(parser)


DEFAULT_MODEL = "laplacianformer_tiny"
"""The model the benchmarks that time one backbone take unless --model names another."""


def add_model_options(parser: argparse.ArgumentParser, *, batch: int) -> None:
    """--model (default ``DEFAULT_MODEL``) and --batch (images per call, this benchmark's default)."""
    parser.add_argument("--model", default=DEFAULT_MODEL, help=f"a registered model (default {DEFAULT_MODEL})")
    parser.add_argument("--batch", type=positive_int, default=batch, help="images per call")


def add_round_options(parser: argparse.ArgumentParser, *, repeats: int, max_seconds: float, per: str) -> None:
    """--repeats (timed rounds) and --max-seconds (the cap on one group's timed seconds), with this benchmark's
    defaults; ``per`` names what one group is, e.g. "(size, runtime)"."""
    parser.add_argument("--repeats", type=positive_int, default=repeats, help=f"timed rounds per {per}")
    parser.add_argument("--max-seconds", type=positive_float, default=max_seconds,
                        help=f"cap on the timed seconds per {per}")


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


def load_record(before: tuple[float, float, float]) -> dict:
    """The machine's load over a run: the load averages before it (``start_timing_run``'s) and now, the CPUs."""
    return dict(before=before, after=os.getloadavg(), cpus=os.cpu_count())


def write_results(args: argparse.Namespace, name: str, load_before: tuple[float, float, float], results: dict, *,
                  variant: str = "") -> tuple[Path, dict]:
    """Writes a timing run's JSON: ``results`` and its ``load_average`` (``load_record``), with ``vars(args)`` as
    the settings, at ``results_stem(args, name)`` + ``variant`` (unless ``--out`` names the stem) + ".json".
    Returns the stem (for the run's other files) and the load record."""
    load = load_record(load_before)
    stem = results_stem(args, name)
    if variant and not args.out:
        stem = stem.with_name(stem.name + variant)
    write_json(stem.with_suffix(".json"), dict(results, load_average=load), settings=vars(args))
    return stem, load


def run_rows(args: argparse.Namespace, name: str, run, argv: Sequence[str] | None) -> tuple[list, Path, dict]:
    """A row benchmark's timed part: ``start_timing_run`` for ``laplacianformer.bench.<name>``, ``run(args)`` (its
    list of row dicts), ``write_results`` of ``{"rows": rows}``. Returns (rows, stem, load record)."""
    load_before = start_timing_run(args, f"laplacianformer.bench.{name}", argv)
    rows = run(args)
    stem, load = write_results(args, name, load_before, dict(rows=rows))
    return rows, stem, load


AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}
"""--autocast choices: the lower-precision dtype of ``torch.autocast`` (absent: float32 throughout)."""


def add_autocast_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--autocast", choices=sorted(AUTOCAST), default=None,
                        help="run the model under torch.autocast with this dtype (default: float32, no autocast)")


def precision_name(autocast: str | None) -> str:
    """The precision label of a row: "fp32", or "bf16-autocast" / "fp16-autocast"."""
    return f"{autocast}-autocast" if autocast else "fp32"


def autocast_context(device: str, autocast: str | None, *, cache: bool = True):
    """``torch.autocast(device type, AUTOCAST[autocast])``, or a null context for None. ``cache=False`` for a
    forward captured in a CUDA graph (a cached weight cast would be freed when the outermost context exits)."""
    if autocast is None:
        return contextlib.nullcontext()
    return torch.autocast(torch.device(device).type, dtype=AUTOCAST[autocast], cache_enabled=cache)
