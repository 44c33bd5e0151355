"""Figures of a detection run (matplotlib, Agg): loss curves per step and val AP / AP50 per epoch.

``history`` is the run's ``history.json``: {"epochs": [{"epoch", "loss", "losses", "val": metrics or
None, ...}], "steps": [{"step", "epoch", "lr", "loss", <component>: float, ...}]} (docs/DETECTION.md).
"""

from __future__ import annotations

from pathlib import Path

from ..train.plots import pyplot, save_figure


def _smooth(ys: list[float], k: int) -> list[float]:
    out, acc = [], 0.0
    for i, y in enumerate(ys):
        acc += y
        if i >= k:
            acc -= ys[i - k]
        out.append(acc / min(i + 1, k))
    return out


def plot_losses(history: dict, path: str | Path, title: str = "") -> Path:
    """Total and component losses against the step (raw, and a running mean over ~1/50 of the run)."""
    plt = pyplot()
    steps = history.get("steps", [])
    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 1]})
    if steps:
        xs = [r["step"] for r in steps]
        k = max(1, len(steps) // 50)
        names = [n for n in steps[0] if n not in ("step", "epoch", "lr")]
        for i, name in enumerate(names):
            ys = [r[name] for r in steps]
            colour = f"C{i % 10}"
            ax.plot(xs, ys, color=colour, alpha=0.25, lw=0.8)
            ax.plot(xs, _smooth(ys, k), color=colour, lw=1.6 if name == "loss" else 1.0, label=name)
        ax_lr.plot(xs, [r["lr"] for r in steps], color="k")
    ax.set(xlabel="step", ylabel="loss", title="training loss (faint: per step)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    ax_lr.set(xlabel="step", ylabel="learning rate", title="schedule")
    ax_lr.grid(alpha=0.3)
    return save_figure(fig, path, title, dpi=110)


def plot_ap(history: dict, path: str | Path, title: str = "") -> Path:
    """Val AP and AP50 (bbox, and segm when present) against the epoch."""
    plt = pyplot()
    rows = [r for r in history.get("epochs", []) if r.get("val")]
    fig, ax = plt.subplots(figsize=(6, 4))
    for t, style in (("bbox", "-"), ("segm", "--")):
        pts = [r for r in rows if t in r["val"]]
        if not pts:
            continue
        for key, colour in (("AP50", "C0"), ("AP", "C1")):
            ax.plot([r["epoch"] for r in pts], [r["val"][t][key] or 0.0 for r in pts], style, marker="o", ms=3,
                    color=colour, label=f"{t} {key}")
    ax.set(xlabel="epoch", ylabel="COCO metric (val)", ylim=(0, 1), title="validation AP")
    ax.grid(alpha=0.3)
    if rows:
        ax.legend(fontsize=8)
    else:
        ax.text(0.5, 0.5, "no evaluation yet", ha="center", va="center", transform=ax.transAxes)
    return save_figure(fig, path, title, dpi=110, fontsize=9)
