"""From recorded cells to evidence: summary, paired CIs, verdicts, completeness, table and plot
(docs/DESIGN.md §7, ablations and evidence).

Top-1 is a fraction in [0, 1] in the JSON; tables and plots show points (%).  Every difference is paired
by seed, over the seeds both sides have; rules of the verdicts are in ``stats``.
"""

from __future__ import annotations

import math
from pathlib import Path

from .ablations import ABLATIONS, Ablation, Claim, Ref
from .common import markdown_table, read_json
from .protocol import same_protocol
from .stats import NEGLIGIBLE, PairedCI, combine, describe, paired, verdict

SELECTION_NOTE = ("Selection bias: the best values were chosen on the same seeds that estimate the difference "
                  "(winner's curse), so this comparison is descriptive, not a confirmatory test.")


def top1_by_label(record: dict) -> dict[str, dict[int, float]]:
    """label -> {seed: top-1} of the recorded cells."""
    out: dict[str, dict[int, float]] = {}
    for cell in record.get("cells", {}).values():
        out.setdefault(cell["label"], {})[int(cell["seed"])] = float(cell["top1"])
    return out


def label_order(record: dict, ablation: Ablation | None) -> list[str]:
    """Registry order, then any other recorded label (legacy files)."""
    present = top1_by_label(record)
    order = [lb for lb in (ablation.labels if ablation else []) if lb in present]
    return order + sorted(lb for lb in present if lb not in order)


def _num(x):
    return None if x is None or (isinstance(x, float) and not math.isfinite(x)) else x


def summarise(record: dict, ablation: Ablation | None = None) -> dict[str, dict]:
    """Per value: n, mean, std of top-1, and the paired difference to the default (value − default)."""
    by = top1_by_label(record)
    default = record.get("default")
    ref = by.get(default, {})
    out = {}
    for label in label_order(record, ablation):
        vals = by[label]
        d = describe([vals[s] for s in sorted(vals)])
        entry = {"n": d.n, "mean": _num(d.mean), "std": _num(d.std), "seeds": sorted(vals),
                 "paired_delta": None, "paired_ci95": None, "paired_halfwidth": None, "paired_n": 0}
        if label != default:
            ci = paired(vals, ref)
            entry.update(paired_delta=_num(ci.mean), paired_ci95=ci.ci, paired_halfwidth=ci.halfwidth, paired_n=ci.n)
        out[label] = entry
    return out


def _resolve(ref: Ref, here: str, pool: dict) -> tuple[str | None, dict[int, float], str]:
    """(label, seed -> top-1, how it was chosen) of one side of a comparison."""
    where = ref.ablation or here
    values = pool.get(where, {})
    cands = [lb for lb in ref.labels if values.get(lb)]
    if not cands:
        missing = f"no cells of {ref.describe()}" + ("" if where == here else f" (needs {where}.json of this protocol)")
        return None, {}, missing
    if not ref.selected:
        return cands[0], values[cands[0]], ""
    best = max(cands, key=lambda lb: sum(values[lb].values()) / len(values[lb]))
    means = ", ".join(f"{lb} {100 * sum(values[lb].values()) / len(values[lb]):.2f}" for lb in cands)
    return best, values[best], f"best of {where}: {best} (means: {means})"


def _fmt_ci(ci: PairedCI) -> str:
    if ci.n == 0:
        return "no common seeds"
    if ci.lo is None:
        return f"{100 * ci.mean:+.2f} pts, n = 1: no CI"
    return f"{100 * ci.mean:+.2f} pts, 95% CI [{100 * ci.lo:+.2f}, {100 * ci.hi:+.2f}] (±{100 * ci.halfwidth:.2f}, n = {ci.n})"


def claim_verdict(claim: Claim, here: str, pool: dict, negligible: float = NEGLIGIBLE) -> dict:
    """{claim, verdict, evidence, claimed_side, comparisons} of one claim on the pooled cells."""
    comps, texts, selected = [], [], False
    for ra, rb in claim.pairs:
        (la, va, ha), (lb, vb, hb) = _resolve(ra, here, pool), _resolve(rb, here, pool)
        selected |= ra.selected or rb.selected
        if la is None or lb is None:
            v = "no_claim" if claim.side is None else "undecided"
            comps.append({"a": la or ra.describe(), "b": lb or rb.describe(), "n": 0, "delta": None, "ci95": None,
                          "halfwidth": None, "verdict": v})
            texts.append(f"{ra.describe()} − {rb.describe()}: {ha or hb} → {v}")
            continue
        ci = paired(va, vb)
        v = verdict(ci, claim.side, negligible)
        comps.append({"a": la, "b": lb, "n": ci.n, "delta": _num(ci.mean), "ci95": ci.ci,
                      "halfwidth": ci.halfwidth, "verdict": v})
        chosen = "; ".join(h for h in (ha, hb) if h)
        texts.append(f"{la} − {lb}: {_fmt_ci(ci)} → {v}" + (f" [{chosen}]" if chosen else ""))
    evidence = "; ".join(texts)
    if selected:
        evidence += ". " + SELECTION_NOTE
    side = None if claim.side is None else ("a − b > 0" if claim.side == 1 else "a − b < 0")
    return {"claim": claim.text, "verdict": combine([c["verdict"] for c in comps]), "evidence": evidence,
            "claimed_side": side, "comparisons": comps}


def sibling_pool(out: Path, record: dict) -> dict[str, dict[str, dict[int, float]]]:
    """ablation -> label -> {seed: top-1} over OUT/*.json of the same protocol (this record last, so it wins)."""
    pool = {}
    for path in sorted(Path(out).glob("*.json")):
        rec = read_json(path)
        if isinstance(rec, dict) and "ablation" in rec and same_protocol(rec.get("protocol"), record.get("protocol")):
            pool[rec["ablation"]] = top1_by_label(rec)
    pool[record["ablation"]] = top1_by_label(record)
    return pool


def missing_cells(record: dict, ablation: Ablation) -> list[str]:
    """Cell keys (LABEL|seed=S) of every value × every seed of the protocol that are not recorded."""
    seeds = (record.get("protocol") or {}).get("seeds") or sorted({int(c["seed"]) for c in record["cells"].values()})
    return [f"{lb}|seed={s}" for lb in ablation.labels for s in seeds if f"{lb}|seed={s}" not in record["cells"]]


def finalise(record: dict, ablation: Ablation, pool: dict | None = None) -> dict:
    """Fills in ``summary``, ``verdicts``, ``missing`` and ``complete`` (in place; returns the record)."""
    pool = pool if pool is not None else {record["ablation"]: top1_by_label(record)}
    record["summary"] = summarise(record, ablation)
    record["verdicts"] = [claim_verdict(c, ablation.name, pool) for c in ablation.all_claims]
    record["missing"] = missing_cells(record, ablation)
    record["complete"] = not record["missing"] and bool(record["cells"])
    return record


def status(record: dict) -> str:
    """The label every view of a results file carries: legacy, smoke test, incomplete, or complete."""
    if "protocol" not in record:
        base = (record.get("settings") or {}).get("base", {})
        return (f"LEGACY small-budget protocol ({base.get('train_subset')} train / {base.get('test_subset')} test "
                f"images, {base.get('epochs')} epochs): not comparable with the fixed protocol")
    parts = []
    if record.get("smoke_test"):
        parts.append("SMOKE TEST, not a result")
    if not record.get("complete"):
        total = len(record.get("cells", {})) + len(record.get("missing", []))
        parts.append(f"INCOMPLETE: {len(record.get('cells', {}))} of {total} cells")
    return "; ".join(parts) or "complete"


def seed_coverage(record: dict) -> str:
    """Which values hold how many seeds, when they differ (e.g. ``"n = 5: lam=0.5, lam=4; n = 3: lam=2"``).

    A file extended with more seeds for some values only is incomplete under its own protocol, but every value it
    reports still has its own n; this phrase says which, so no reader takes the file's n for every row's n.
    """
    counts = {label: len(seeds) for label, seeds in top1_by_label(record).items()}
    if len(set(counts.values())) < 2:
        return ""
    by_n: dict[int, list[str]] = {}
    for label in label_order(record, ablation_of(record)):
        if label in counts:
            by_n.setdefault(counts[label], []).append(label)
    return "; ".join(f"n = {n}: {', '.join(labels)}" for n, labels in sorted(by_n.items(), reverse=True))


def _pts(x, fmt="{:.2f}"):
    return "n/a" if x is None else fmt.format(100 * x)


def protocol_line(record: dict) -> str:
    p = record.get("protocol")
    if not p:
        return "Protocol: legacy (see `settings`)."
    r = p["recipe"]
    seeds = p.get("seeds") or []
    seed_txt = f"{seeds[0]}–{seeds[-1]}" if len(seeds) > 1 else (str(seeds[0]) if seeds else "none")
    keys = ("batch_size", "lr", "weight_decay", "warmup_epochs", "drop_path", "label_smoothing", "random_crop", "hflip",
            "threads")
    return (f"Protocol `{p.get('name')}`: {r.get('model')} on {r.get('data')}, img {p['img_size']}, stage 1 "
            f"{p['stage1_tokens']} tokens for m = {p['landmarks']} landmarks, {p['train_images']} train / "
            f"{p['test_images']} test images, {p['epochs']} epochs, seeds {seed_txt}; "
            + ", ".join(f"{k} {r.get(k)}" for k in keys) + " (all flags in the JSON `protocol.recipe`).")


def markdown(record: dict, ablation: Ablation | None) -> str:
    """Title with the file's status, protocol, per-value table with paired 95% CIs, verdicts."""
    summary = record.get("summary") or summarise(record, ablation)
    default = record.get("default")
    loss = {}
    for c in record.get("cells", {}).values():
        if isinstance(c.get("loss"), (int, float)):
            loss.setdefault(c["label"], []).append(c["loss"])
    rows = []
    for label, s in summary.items():
        sd = "" if s["std"] is None else f" ± {_pts(s['std'])}"
        ci = s["paired_ci95"]
        rows.append([
            label + (" (default)" if label == default else ""), s["n"], f"{_pts(s['mean'])}{sd}",
            "—" if label == default else _pts(s["paired_delta"], "{:+.2f}"),
            "—" if label == default else ("n/a" if ci is None else f"[{100 * ci[0]:+.2f}, {100 * ci[1]:+.2f}]"),
            "—" if label == default else s["paired_n"],
            f"{describe(loss[label]).mean:.3f}" if label in loss else "n/a",
        ])
    setting = record.get("setting", "value")
    table = markdown_table([setting, "n", "top-1 % (mean ± sd)", "paired Δ vs default (points)", "95 % CI (points)",
                            "pairs", "test loss"], rows)
    name = record.get("ablation")
    lines = [f"### ablation `{name}` — {status(record)}", "", record.get("question", ""), "", protocol_line(record), "",
             table, ""]
    if record.get("unsupported"):
        lines += [f"Not run: {lb}: {why}." for lb, why in record["unsupported"].items()] + [""]
    if "cg_equal_time" in record.get("resolved", {}):
        t = record["resolved"]["cg_equal_time"]
        lines += [f"CG at NS's wall time: {t['cg_iters']} iterations (NS {t['ns_iters']} iterations "
                  f"{1e3 * t['ns_seconds']:.2f} ms, CG {1e3 * t['cg_seconds_per_iter']:.3f} ms/iteration on {t['source']}).", ""]
    if record.get("verdicts"):
        lines += ["Verdicts (rule: `laplacianformer.experiments.stats`; 95 % paired t CI, 0.5 points = negligible):", "",
                  markdown_table(["claim", "verdict", "evidence"],
                                 [[v["claim"], f"**{v['verdict']}**", v["evidence"]] for v in record["verdicts"]]), ""]
    if record.get("seed_policy"):
        sp = record["seed_policy"]
        lines += [f"Seeds added until every paired half-width ≤ {100 * sp['target_halfwidth']:.2f} points or "
                  f"{sp['max_seeds']} seeds: target {'met' if sp['met'] else 'NOT met'}.", ""]
    return "\n".join(lines)


def plot(record: dict, ablation: Ablation | None, path: Path) -> None:
    """Left: top-1 per value (mean, sd bars, seeds as dots). Right: paired Δ vs default with 95 % CI bars."""
    from .common import pyplot

    plt = pyplot()
    summary = record.get("summary") or summarise(record, ablation)
    by = top1_by_label(record)
    labels = list(summary)
    default = record.get("default")
    fig, (ax, bx) = plt.subplots(1, 2, figsize=(1.1 * len(labels) + 7.0, 4.0),
                                 gridspec_kw={"width_ratios": [1.0, 1.0]})
    xs = list(range(len(labels)))
    means = [100 * (summary[lb]["mean"] or 0.0) for lb in labels]
    stds = [100 * (summary[lb]["std"] or 0.0) for lb in labels]
    colors = ["tab:orange" if lb == default else "tab:blue" for lb in labels]
    ax.bar(xs, means, yerr=stds, color=colors, alpha=0.8, capsize=4)
    pts = []
    for x, lb in zip(xs, labels):
        ys = [100 * v for v in by[lb].values()]
        pts += ys
        ax.plot([x] * len(ys), ys, "k.", ms=4)
    if pts:
        ax.set_ylim(max(0.0, min(pts) - 3.0), min(100.0, max(pts) + 2.0))
    ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("test top-1 (%)")
    ax.set_title("top-1: mean ± sd, dots = seeds (y truncated)", fontsize=8)
    ax.grid(True, axis="y", alpha=0.3)
    others = [lb for lb in labels if lb != default]
    for i, lb in enumerate(others):
        s = summary[lb]
        if s["paired_delta"] is None:
            continue
        d = 100 * s["paired_delta"]
        if s["paired_ci95"] is None:
            bx.plot([i], [d], "o", mfc="none", color="tab:gray")
        else:
            lo, hi = (100 * v for v in s["paired_ci95"])
            bx.errorbar([i], [d], yerr=[[d - lo], [hi - d]], fmt="o", color="tab:blue", capsize=4)
    bx.axhline(0.0, color="k", lw=0.8)
    bx.axhspan(-100 * NEGLIGIBLE, 100 * NEGLIGIBLE, color="tab:green", alpha=0.12, label="±0.5 points")
    bx.set_xticks(range(len(others)), others, rotation=30, ha="right", fontsize=8)
    bx.set_xlim(-0.6, max(len(others), 1) - 0.4)
    bx.set_ylabel(f"paired Δ vs {default} (points)")
    bx.set_title("paired difference, 95 % t CI (hollow: n = 1, no CI)", fontsize=8)
    bx.legend(fontsize=7, loc="best")
    bx.grid(True, axis="y", alpha=0.3)
    proto = record.get("protocol")
    extra = f" — protocol {proto.get('name')}, {len(proto.get('seeds') or [])} seeds" if proto else ""
    fig.suptitle(f"ablation {record.get('ablation')} — {status(record)}{extra}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def ablation_of(record: dict) -> Ablation | None:
    return ABLATIONS.get(record.get("ablation"))
