"""Where a benchmark writes: a run directory by default, the published results only when asked.

Default: ``runs/bench/<name>/<stem>.*`` under the current directory. ``--out STEM``: exactly there.
``--publish [DIR]``: into ``DIR`` (default ``benchmarks/results`` of the current directory, which must
exist: run from the repository root), replacing the published files. Nothing is located from the
package's own path, so an installed copy never writes into a source tree it was not asked to.
"""

from __future__ import annotations

import argparse
from pathlib import Path

RUNS = Path("runs") / "bench"
PUBLISHED = Path("benchmarks") / "results"


def add_publish_option(parser) -> None:
    """--publish [DIR] (an argparse parser or group)."""
    parser.add_argument("--publish", nargs="?", const=str(PUBLISHED), default=None, metavar="DIR",
                        help=f"write into DIR (default ./{PUBLISHED}, which must exist), replacing the published "
                             f"files there, instead of {RUNS}/<benchmark>/")


def add_output_options(parser: argparse.ArgumentParser) -> None:
    """--out STEM | --publish [DIR] (mutually exclusive)."""
    group = parser.add_mutually_exclusive_group()
    group.add_argument("--out", default=None, metavar="STEM",
                       help=f"output stem: STEM.json, STEM.md, ... (default {RUNS}/<benchmark>/<stem>)")
    add_publish_option(group)


def publish_dir(target: str | Path) -> Path:
    """The publish target, which must be an existing directory (ValueError naming --publish otherwise)."""
    d = Path(target)
    if not d.is_dir():
        raise ValueError(f"--publish: {d}: no such directory (run from the repository root, or pass --publish DIR)")
    return d


def output_stem(args: argparse.Namespace, name: str, stem: str) -> Path:
    """--out; else the --publish directory / ``stem``; else runs/bench/``name``/``stem`` (relative to the cwd)."""
    if getattr(args, "out", None):
        return Path(args.out)
    if getattr(args, "publish", None):
        return publish_dir(args.publish) / stem
    return RUNS / name / stem
