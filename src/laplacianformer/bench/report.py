"""The writers of a benchmark's results: JSON with its machine and settings, Markdown tables, log–log
plots, and the scaling exponent of a series."""

from __future__ import annotations

import datetime
import json
import math
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

import torch

from .machine import machine_info


def write_json(path: str | Path, results: object, *, settings: Mapping | None = None) -> Path:
    """Writes {"machine", "command", "settings", "timestamp_utc", "results"} as indented JSON."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    payload = {
        "machine": machine_info(),
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "settings": dict(settings or {}),
        "timestamp_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "results": results,
    }
    path.write_text(json.dumps(payload, indent=2) + "\n")
    return path


def write_text(path: str | Path, text: str) -> Path:
    """Writes ``text``, creating the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def markdown_table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """A GitHub Markdown table; cells are str()-ed, floats printed with up to 4 significant digits."""

    def cell(x: object) -> str:
        if isinstance(x, float):
            return f"{x:.4g}"
        return "" if x is None else str(x)

    lines = ["| " + " | ".join(map(cell, header)) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(map(cell, row)) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def report_header(title: str, args, load: Mapping, extra: str = "") -> str:
    """'# title (device; CPU; torch; allocator[; extra])' and the load-average line of a Markdown report;
    ``load`` is {"before": loadavg, "after": loadavg, "cpus": n}."""
    extra = f"; {extra}" if extra else ""
    return (
        f"# {title} ({args.device}; {machine_info().get('cpu', '')}; torch {torch.__version__}; allocator "
        f"{args.allocator}{extra})\n\nLoad average (1 min) before/after: {load['before'][0]:.1f} / "
        f"{load['after'][0]:.1f} on {load['cpus']} CPUs.\n\n"
    )


def figure(*panels: int, size: tuple[float, float]):
    """(fig, axes) of a new Agg figure with ``panels`` = (rows, columns) subplots (none: one)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(*panels, figsize=size)


def save_figure(fig, path: str | Path, title: str | None = None) -> Path:
    """Lays ``fig`` out, writes it to ``path`` (PNG, 110 dpi) and closes it."""
    import matplotlib.pyplot as plt

    if title:
        fig.suptitle(title, fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return Path(path)


def bar_labels(ax, labels: Sequence[str], ylabel: str, **tick_options) -> None:
    """x ticks ``labels`` under bars 0..n-1 and the y label."""
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, **tick_options)
    ax.set_ylabel(ylabel)


def plot_loglog(path: str | Path, panels: Sequence[Mapping], *, xlabel: str, title: str | None = None) -> Path:
    """Side-by-side log-log panels.  panels: [{"ylabel": str, "series": {label: (xs, ys)}}, ...].

    Series without a positive point are left out; a label keeps its colour across panels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig, axes = plt.subplots(1, len(panels), figsize=(6.0 * len(panels), 4.5), squeeze=False)
    labels = sorted({label for panel in panels for label in panel["series"]}, key=str)
    colours = {label: f"C{i % 10}" for i, label in enumerate(labels)}
    for ax, panel in zip(axes[0], panels):
        for label, (xs, ys) in panel["series"].items():
            pts = [(x, y) for x, y in zip(xs, ys) if y is not None and y > 0]
            if pts:
                ax.loglog(*zip(*pts), marker="o", label=label, color=colours[label])
        ax.set_xlabel(xlabel)
        ax.set_ylabel(panel["ylabel"])
        if panel.get("title"):
            ax.set_title(panel["title"])
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def fit_exponent(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Least-squares slope of log y on log x (the scaling exponent); None with fewer than two points."""
    pts = [(math.log(x), math.log(y)) for x, y in zip(xs, ys) if y is not None and y > 0]
    if len(pts) < 2:
        return None
    mx = sum(p[0] for p in pts) / len(pts)
    my = sum(p[1] for p in pts) / len(pts)
    sxx = sum((p[0] - mx) ** 2 for p in pts)
    return sum((p[0] - mx) * (p[1] - my) for p in pts) / sxx if sxx > 0 else None
