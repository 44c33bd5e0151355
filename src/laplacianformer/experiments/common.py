"""Shared plumbing for the experiments: atomic JSON, Markdown tables, headless plotting."""

from __future__ import annotations

import json
import math
import os
import platform
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import torch


def write_json(path: str | Path, obj) -> Path:
    """Write ``obj`` as indented JSON atomically (temp file + rename), so an interrupted run never leaves half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=False)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def jsonable(value):
    """``value`` as plain JSON types: tuples as lists, keys as strings, tensors/NumPy scalars as numbers,
    non-finite floats as strings, anything else as its str."""
    if isinstance(value, (str, int, bool)) or value is None:
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [jsonable(v) for v in value]
    if hasattr(value, "item"):
        return jsonable(value.item())
    return str(value)


def run_command(prog: str, body) -> int:
    """``body()``'s exit status, the experiments' two user-facing stops turned into one line each:
    ValueError -> 2 (the message names the argument), KeyboardInterrupt -> 130 (recorded cells are kept)."""
    try:
        return body()
    except ValueError as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:
        print(f"{prog}: interrupted ({exc}); recorded cells are kept, rerun the same command to resume",
              file=sys.stderr)
        return 130


def read_json(path: str | Path):
    """The parsed JSON at ``path``, or None when the file does not exist."""
    path = Path(path)
    if not path.exists():
        return None
    with open(path) as fh:
        return json.load(fh)


def markdown_table(header: Sequence[str], rows: Sequence[Sequence]) -> str:
    """A GitHub Markdown table; floats are printed as given (format them before)."""
    lines = ["| " + " | ".join(str(h) for h in header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)


def environment() -> dict:
    """What the numbers were measured on."""
    return {
        "torch": torch.__version__,
        "python": platform.python_version(),
        "machine": platform.machine(),
        "threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
    }


def pyplot():
    """matplotlib.pyplot with the headless Agg backend."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt
