"""Summary of a set of detection runs (``scripts/detection_runs.sh``): COCO metrics per backbone over seeds,
paired differences against the Laplacian backbone with 95 % CIs (``stats.paired``, DESIGN.md §7), and the
val AP curves.

    python -m laplacianformer.experiments.detection_report --runs runs/detection --out results/detection

Reads only files: each run directory's ``train_config.json`` (detector, backbone, ``backbone_kwargs.attn``
and its ``attn_kwargs``, seed), ``history.json`` (per-epoch val metrics on the run's val subset, train and CPU seconds) and
``eval_val.json`` (``detect eval`` on the full val split). A run without ``eval_val.json`` is listed as
unfinished and left out of every statistic. Writes ``OUT/fashionscenes.{json,md}`` and ``OUT/ap_curves.png``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from .stats import describe, paired

METRICS = ("AP", "AP50", "AP75")
REFERENCE_ATTN = "laplacian"
SOFTMAX_ATTN = "softmax"
SCALED = "norm_scale=inv_n"
DEFAULT_ATTN = f"{REFERENCE_ATTN} {SCALED}"
"""The 0.2 default's label (the paper's Laplacian with the output scale 1/N, DESIGN.md §4.6)."""


def _is_scaled_family(attn: str) -> bool:
    """A kernel family other than the Laplacian at the 0.2 default's output scale (``kernels variants``)."""
    family, *settings = attn.split(" ")
    return family not in (REFERENCE_ATTN, SOFTMAX_ATTN) and SCALED in settings


def attention_label(backbone_kwargs: dict | None) -> str:
    """The token mixer of a run: ``attn`` (default laplacian), then its ``attn_kwargs`` as k=v, sorted
    (``laplacian norm_scale=inv_n``): runs of one mixer with other settings are other groups."""
    kw = backbone_kwargs or {}
    extra = " ".join(f"{k}={v}" for k, v in sorted((kw.get("attn_kwargs") or {}).items()))
    return f"{kw.get('attn', REFERENCE_ATTN)}{' ' + extra if extra else ''}"


def _read_json(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"{path}: not a readable JSON file ({exc})") from exc


def collect(runs: str | Path) -> tuple[list[dict], list[str]]:
    """(finished runs, names of unfinished ones) under ``runs``; one dict per finished run."""
    root = Path(runs)
    if not root.is_dir():
        raise ValueError(f"runs: {root} is not a directory")
    done, unfinished = [], []
    for d in sorted(p for p in root.iterdir() if (p / "train_config.json").is_file()):
        if not (d / "eval_val.json").is_file():
            unfinished.append(d.name)
            continue
        cfg = _read_json(d / "train_config.json")
        metrics = _read_json(d / "eval_val.json")
        history = _read_json(d / "history.json") if (d / "history.json").is_file() else {"epochs": []}
        epochs = history.get("epochs", [])
        done.append({
            "name": d.name,
            "detector": cfg.get("detector"),
            "backbone": cfg.get("backbone"),
            "attn": attention_label(cfg.get("backbone_kwargs")),
            "seed": int(cfg.get("seed", 0)),
            "steps": epochs[-1]["step"] if epochs else None,
            "train_time_s": sum(r.get("train_time_s", 0.0) for r in epochs),
            "cpu_time_s": sum(r.get("cpu_time_s", 0.0) for r in epochs),
            "bbox": {k: metrics["bbox"][k] for k in METRICS},
            "segm": {k: metrics["segm"][k] for k in METRICS} if "segm" in metrics else None,
            "curve": [{"step": r["step"], "AP": r["val"]["bbox"]["AP"], "AP50": r["val"]["bbox"]["AP50"]}
                      for r in epochs if r.get("val")],
            "val_images": metrics.get("images"),
        })
    return done, unfinished


def _group_key(run: dict) -> str:
    return f"{run['detector']} / {run['backbone']} / {run['attn']}"


def summarize(runs: list[dict]) -> dict:
    """{'groups': {key: {n, seeds, <metric>: Describe-dict, ...}}, 'paired': [...]} over finished runs."""
    groups: dict[str, list[dict]] = {}
    for r in runs:
        groups.setdefault(_group_key(r), []).append(r)
    out_groups = {}
    for key, rs in groups.items():
        g = {"n": len(rs), "seeds": sorted(r["seed"] for r in rs)}
        for kind in ("bbox", "segm"):
            if all(r[kind] for r in rs):
                g[kind] = {m: describe([r[kind][m] for r in rs]).__dict__ for m in METRICS}
        g["train_time_s"] = describe([r["train_time_s"] for r in rs]).__dict__
        g["cpu_time_s"] = describe([r["cpu_time_s"] for r in rs]).__dict__
        out_groups[key] = g
    comparisons = []

    def compare(ref_key: str, rs: list[dict]) -> None:
        ref = groups[ref_key]
        for m in ("AP", "AP50"):
            ci = paired({r["seed"]: r["bbox"][m] for r in ref}, {r["seed"]: r["bbox"][m] for r in rs})
            comparisons.append({"a": ref_key, "b": _group_key(rs[0]), "metric": f"bbox {m}",
                                "n": ci.n, "mean_delta": ci.mean, "std": ci.std, "ci95": ci.ci})

    # every other mixer against the paper-default Laplacian; then every Laplacian variant against softmax
    # (how much of the gap is left); then every other kernel family at the 0.2 output scale against the 0.2
    # default and against softmax (a = the family)
    for key, rs in groups.items():
        det, bb, attn = rs[0]["detector"], rs[0]["backbone"], rs[0]["attn"]
        if attn != REFERENCE_ATTN and not _is_scaled_family(attn) and f"{det} / {bb} / {REFERENCE_ATTN}" in groups:
            compare(f"{det} / {bb} / {REFERENCE_ATTN}", rs)
    for key, rs in groups.items():
        det, bb, attn = rs[0]["detector"], rs[0]["backbone"], rs[0]["attn"]
        if attn.startswith(REFERENCE_ATTN + " ") and f"{det} / {bb} / {SOFTMAX_ATTN}" in groups:
            compare(key, groups[f"{det} / {bb} / {SOFTMAX_ATTN}"])
    for key, rs in groups.items():
        det, bb, attn = rs[0]["detector"], rs[0]["backbone"], rs[0]["attn"]
        for ref in (DEFAULT_ATTN, SOFTMAX_ATTN):
            if _is_scaled_family(attn) and f"{det} / {bb} / {ref}" in groups:
                compare(key, groups[f"{det} / {bb} / {ref}"])
    return {"groups": out_groups, "paired": comparisons}


def _fmt(d: dict | None, scale: float = 100.0) -> str:
    if not d or d["mean"] is None:
        return "—"
    if d["std"] is None:
        return f"{scale * d['mean']:.1f}"
    return f"{scale * d['mean']:.1f} ± {scale * d['std']:.1f}"


def _fmt_delta(c: dict) -> tuple[str, str]:
    """(mean Δ, 95 % CI) of one paired row, in points."""
    mean = "—" if c["mean_delta"] is None else f"{100 * c['mean_delta']:+.1f}"
    ci = "needs ≥ 2 seeds" if c["ci95"] is None else f"[{100 * c['ci95'][0]:+.1f}, {100 * c['ci95'][1]:+.1f}]"
    return mean, ci


def markdown(report: dict) -> str:
    s = report["summary"]
    lines = ["# Detection on FashionScenes: full-val COCO metrics", "",
             "Generated by `python -m laplacianformer.experiments.detection_report` from the run directories "
             f"under `{report['runs']}`. AP values in points (COCO AP × 100), mean ± sample std over seeds.", "",
             "| detector / backbone / attention | seeds | bbox AP | AP50 | AP75 | segm AP | train min / run | CPU min / run |",
             "|---|---|---|---|---|---|---|---|"]
    for key, g in s["groups"].items():
        segm = _fmt(g.get("segm", {}).get("AP")) if g.get("segm") else "—"
        lines.append(f"| {key} | {', '.join(map(str, g['seeds']))} | {_fmt(g['bbox']['AP'])} | "
                     f"{_fmt(g['bbox']['AP50'])} | {_fmt(g['bbox']['AP75'])} | {segm} | "
                     f"{_fmt(g['train_time_s'], 1 / 60)} | {_fmt(g['cpu_time_s'], 1 / 60)} |")
    if s["paired"]:
        lines += ["", "Paired differences a − b (same seeds; points; 95 % CI from Student's t): every mixer against "
                  "the paper-default Laplacian, then every Laplacian variant against softmax (the gap left), then "
                  "every other kernel family at the output scale 1/N against the 0.2 default "
                  f"(`{DEFAULT_ATTN}`) and against softmax:", "",
                  "| a | b | metric | n | mean Δ (a − b) | 95 % CI |", "|---|---|---|---|---|---|"]
        for c in s["paired"]:
            mean, ci = _fmt_delta(c)
            lines.append(f"| {c['a']} | {c['b']} | {c['metric']} | {c['n']} | {mean} | {ci} |")
    if report["unfinished"]:
        lines += ["", f"Unfinished (left out): {', '.join(report['unfinished'])}."]
    return "\n".join(lines) + "\n"


def _delta(paired_rows: list[dict], a: str, b: str) -> tuple[str, str]:
    """(mean Δ, 95 % CI) of bbox AP for a − b, in points, from the report's paired rows ("—" when absent)."""
    for c in paired_rows:
        if c["a"] == a and c["b"] == b and c["metric"] == "bbox AP":
            return _fmt_delta(c)
    return "—", "—"


def kernel_family_table(report: dict) -> str:
    """The kernel-family rows of the report (DESIGN §7.8): each other family at the output scale 1/N, one row per
    (detector, backbone), with its paired bbox AP differences against the 0.2 default and SR-softmax; the two
    references' own rows first. Empty when the report holds no such run."""
    s = report["summary"]
    rows = []
    for key, g in s["groups"].items():
        det, bb, attn = key.split(" / ", 2)
        if not _is_scaled_family(attn):
            continue
        default, soft = f"{det} / {bb} / {DEFAULT_ATTN}", f"{det} / {bb} / {SOFTMAX_ATTN}"
        for ref in (default, soft):
            if ref in s["groups"] and not any(r[0] == ref for r in rows):
                r = s["groups"][ref]
                rows.append((ref, [det, bb, ref.split(" / ", 2)[2], ", ".join(map(str, r["seeds"])),
                                   _fmt(r["bbox"]["AP"]), _fmt(r["bbox"]["AP50"]), "", "", "", ""]))
        rows.append((key, [det, bb, attn, ", ".join(map(str, g["seeds"])), _fmt(g["bbox"]["AP"]),
                           _fmt(g["bbox"]["AP50"]), *_delta(s["paired"], key, default), *_delta(s["paired"], key, soft)]))
    if not rows:
        return ""
    lines = ["| detector | backbone | attention | seeds | bbox AP | AP50 | Δ AP vs 0.2 default | 95 % CI | "
             "Δ AP vs SR-softmax | 95 % CI |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for _, cells in rows]
    return "\n".join(lines) + "\n"


def plot_curves(runs: list[dict], path: Path) -> Path:
    """Val AP50 and AP (on each run's val subset, per epoch) against the optimiser step, one line per run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours: dict[str, str] = {}
    for r in runs:
        if not r["curve"]:
            continue
        key = _group_key(r)
        colour = colours.setdefault(key, f"C{len(colours) % 10}")
        xs = [p["step"] for p in r["curve"]]
        for ax, m in zip(axes, ("AP50", "AP")):
            ax.plot(xs, [p[m] for p in r["curve"]], marker="o", color=colour, lw=1.2,
                    label=f"{key} s{r['seed']}")
    for ax, m in zip(axes, ("AP50", "AP")):
        ax.set(xlabel="optimiser step", ylabel=f"val bbox {m} (val subset)", title=f"bbox {m} during training")
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def report(runs: str | Path, out: str | Path) -> dict:
    done, unfinished = collect(runs)
    result = {"runs": str(runs), "finished": done, "unfinished": unfinished, "summary": summarize(done)}
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "fashionscenes.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "fashionscenes.md").write_text(markdown(result))
    plot_curves(done, out / "ap_curves.png")
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m laplacianformer.experiments.detection_report",
                                description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", default="runs/detection", help="directory holding the run directories")
    p.add_argument("--out", default="results/detection", help="where the JSON, Markdown and PNG go")
    args = p.parse_args(argv)
    try:
        result = report(args.runs, args.out)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(markdown(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
