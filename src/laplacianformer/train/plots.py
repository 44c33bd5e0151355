"""Figures of a run: loss/accuracy curves per epoch and the confusion matrix (matplotlib, Agg backend)."""

from __future__ import annotations

from pathlib import Path


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (files only, no display)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path: str | Path, title: str = "", dpi: int = 120, **title_kw) -> Path:
    """Titles ``fig`` (when ``title``; ``title_kw`` to ``suptitle``), lays it out, writes it to ``path`` and
    closes it; returns ``Path(path)``."""
    if title:
        fig.suptitle(title, **title_kw)
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)
    return Path(path)


def plot_curves(histories: dict[str, list[dict]], path: str | Path, title: str = "") -> Path:
    """Train/test loss and test top-1 against epoch, one line per named history (epoch rows of a run)."""
    plt = pyplot()
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
    return save_figure(fig, path, title)


def plot_confusion(confusion: list[list[int]], classes, path: str | Path, title: str = "") -> Path:
    """Row-normalised confusion matrix (rows: true class, columns: prediction) with counts in the cells."""
    import numpy as np

    plt = pyplot()
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
    return save_figure(fig, path)


def plot_cost(cells: list[dict], path: str | Path, title: str = "") -> Path:
    """Log–log panels against image side: forward and training-step ms per image, peak heap MiB (forward
    solid, training step dashed) and autograd-saved activation MiB; one colour per attention
    (cells of ``bench.model_cost.measure_cost``; skipped cells are left out)."""
    plt = pyplot()
    attns = list(dict.fromkeys(c["attn"] for c in cells))
    colour = {a: f"C{i}" for i, a in enumerate(attns)}
    panels = [("forward: ms / image (— wall, ·· CPU)", [("infer", "ms_per_image", "-"),
                                                        ("infer", "cpu_ms_per_image", ":")]),
              ("training step: ms / image (— wall, ·· CPU)", [("train", "ms_per_image", "-"),
                                                              ("train", "cpu_ms_per_image", ":")]),
              ("peak heap MiB (— forward, -- train step)", [("infer", "peak_heap_mib", "-"),
                                                            ("train", "peak_heap_mib", "--")]),
              ("autograd-saved activations MiB", [("train", "activations_mib", "-")])]
    sizes = sorted({c["size"] for c in cells})
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.8))
    for ax, (ylabel, series) in zip(axes, panels):
        for mode, key, style in series:
            for a in attns:
                pts = [(c["size"], c[key]) for c in cells if c["attn"] == a and c["mode"] == mode
                       and not c.get("skipped") and c.get(key)]
                if pts:
                    ax.loglog(*zip(*sorted(pts)), style, marker="o", ms=3, color=colour[a],
                              label=a if style == "-" else None)
        ax.set_xticks(sizes, [str(s) for s in sizes])
        ax.minorticks_off()
        ax.set(xlabel="image side (px)", title=ylabel)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    return save_figure(fig, path, title)


def plot_steps(runs: dict[str, dict], path: str | Path, title: str = "", smooth: int = 25) -> Path:
    """Training loss and batch top-1 against images seen (moving average over ``smooth`` steps), with each
    run's final test top-1 as a marker. ``runs``: name -> {"steps": [log.jsonl rows], "top1": float | None,
    "batch_size": int}."""
    plt = pyplot()
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(10, 4))

    def avg(xs):
        out, acc = [], 0.0
        for i, x in enumerate(xs):
            acc += x - (xs[i - smooth] if i >= smooth else 0.0)
            out.append(acc / min(i + 1, smooth))
        return out

    for i, (name, run) in enumerate(runs.items()):
        rows = run["steps"]
        if not rows:
            continue
        seen = [r["step"] * run["batch_size"] / 1000 for r in rows]
        c = f"C{i}"
        ax_loss.plot(seen, avg([r["loss"] for r in rows]), color=c, label=name)
        ax_acc.plot(seen, avg([100 * r["batch_top1"] for r in rows]), color=c, label=f"{name} train batches")
        if run.get("top1") is not None:
            ax_acc.plot([seen[-1]], [100 * run["top1"]], "*", ms=10, color=c,
                        label=f"{name} test {100 * run['top1']:.2f} %")
    ax_loss.set(xlabel="training images seen (thousands)", ylabel=f"loss (moving average, {smooth} steps)",
                title="training loss")
    ax_acc.set(xlabel="training images seen (thousands)", ylabel="top-1 (%)", title="accuracy")
    ax_acc.set_ylim(50, 100)
    for ax in (ax_loss, ax_acc):
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    return save_figure(fig, path, title)
