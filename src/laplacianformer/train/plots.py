"""Figures of a run: loss/accuracy curves per epoch and the confusion matrix (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_curves(histories: dict[str, list[dict]], path: str | Path, title: str = "") -> Path:
    """Train/test loss and test top-1 against epoch, one line per named history (epoch rows of a run)."""
    plt = _plt()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))
    for name, rows in histories.items():
        ep = [r["epoch"] for r in rows]
        line = ax_loss.plot(ep, [r["train_loss"] for r in rows], label=f"{name} train")[0]
        ax_loss.plot(ep, [r["test_loss"] for r in rows], "--", color=line.get_color(), label=f"{name} test")
        ax_acc.plot(ep, [100 * r["train_top1"] for r in rows], ":", color=line.get_color(), label=f"{name} train")
        ax_acc.plot(ep, [100 * r["test_top1"] for r in rows], "-o", ms=3, color=line.get_color(), label=f"{name} test")
    ax_loss.set(xlabel="epoch", ylabel="loss (train: smoothed/mixed targets)", title="loss")
    ax_acc.set(xlabel="epoch", ylabel="top-1 accuracy (%)", title="accuracy")
    from matplotlib.ticker import MaxNLocator

    for ax in (ax_loss, ax_acc):
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)


def plot_confusion(confusion: list[list[int]], classes, path: str | Path, title: str = "") -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: prediction) with counts in the cells."""
    import numpy as np

    plt = _plt()
    cm = np.asarray(confusion, dtype=float)
    norm = cm / np.maximum(cm.sum(1, keepdims=True), 1)
    k = len(classes)
    fig, ax = plt.subplots(figsize=(1.0 + 0.6 * k, 1.0 + 0.55 * k))
    ax.imshow(norm, cmap="Blues", vmin=0, vmax=1)
    ax.set_xticks(range(k), [str(c) for c in classes], rotation=60, ha="right", fontsize=7)
    ax.set_yticks(range(k), [str(c) for c in classes], fontsize=7)
    ax.set(xlabel="predicted", ylabel="true", title=title or "confusion matrix")
    if k <= 20:
        for i in range(k):
            for j in range(k):
                ax.text(j, i, int(cm[i, j]), ha="center", va="center", fontsize=6,
                        color="white" if norm[i, j] > 0.5 else "black")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return Path(path)
