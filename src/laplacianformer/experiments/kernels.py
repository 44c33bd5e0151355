"""``laplacianformer kernels``: which kernel family works for vision attention (docs/DESIGN.md §7.8).

The paper argues that the L1 Laplacian kernel beats the Gaussian for vision and names the study of other
families as its sequel. This runs it under the validated protocol of ``laplacianformer accuracy``
(``fmnist28-val``: 10,000 training images held out for validation, DESIGN §7.5) with the 0.2 defaults
(the injective normalisation and ``norm_scale="inv_n"``, §4.6), for every shipped family of
``ops.kernel_families``:

    select   each family at its bandwidths (``bandwidths``: its default λ times ``LAMBDA_FACTORS``), seeds
             0..2 -> OUT/selection.json: per family the λ of the best mean validation top-1 (validation only)
    confirm  each family at its selected λ, the Laplacian default and SR-softmax, seeds 0..4 -> OUT/confirmation.json:
             test top-1, paired 95 % CIs of each family against both
    report   rewrite both (JSON, Markdown, PNG) from OUT/cells.json
    variants the detection runs the study asks for: the best two non-Laplacian families at their selected λ
             (by validation), one "LABEL BACKBONE_KWARGS_JSON" line each (scripts/detection_runs.sh reads them)
    list     the cells' labels and settings
    why      per family's model: the distances its kernel sees, its kernel values and the Nyström error at 196,
             1,024 and 4,096 tokens, and the ranking against the heavy-tail argument (``kernel_why``; own options:
             ``kernels why --help``) -> results/kernels/why/

Cells are resumable (each a single-threaded training process, checkpointed every 200 steps) and written to
OUT/cells.json as they finish. A cell whose model is identical to one already trained under the same protocol
in ``results/accuracy/cells.json`` (the Laplacian at λ = 4 and 0.5 with the 1/N scale, SR-softmax) is taken
from there (``reused_from``), never retrained. In the background:

    nohup laplacianformer kernels select --jobs 2 > kernels-select.log 2>&1 &
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from ..ops.kernel_families import SHIPPED, kernel_spec
from .ablate import _fmt_time, build_protocol, canonical_attention, cell_key
from .accuracy import PROTOCOL_NAME, VAL_PROTOCOL, _ci, _pts, open_cells, record_cells, validation_split
from .common import jsonable, markdown_table, pyplot, read_json, run_command, write_json
from .protocol import same_protocol
from .stats import describe, on_common_seeds, paired, verdict

DEFAULT_OUT = "results/kernels"
DEFAULT_RUNS = "runs/kernels"
BORROW_FROM = "results/accuracy/cells.json"
SELECT_SEEDS, CONFIRM_SEEDS, MIN_SELECT_SEEDS = 3, 5, 3
SCALE = {"norm_scale": "inv_n"}
"""The 0.2 default output scale, written out: cells train under version 1's defaults (``protocol``)."""
LAMBDA_FACTORS = (0.25, 1.0, 4.0)
"""The sweep of each family: its matched bandwidth (``MATCHED_LAMBDAS``) times these, a factor 4 either way."""
MATCHED_LAMBDAS = {"laplacian": 4.0, "gaussian": 3.9, "exponential": 0.87, "matern32": 0.36, "cauchy": 0.11}
"""λ of each family whose median kernel value on the model's own stage-1 query–landmark distances equals the
Laplacian default's (λ = 4), at initialisation (seed 0, 64 test images; each family on q, k scaled by its
default qk_scale), two significant digits: ``matched_bandwidths`` recomputes them (DESIGN §7.8). The trained
model's distances depend on λ itself, so the match is made before training."""
EXTRA_LAMBDAS = {"laplacian": (0.5,)}
"""λ measured already under this protocol (the tuned preset's λ = 0.5 with the 1/N scale), swept for free."""
LAPLACIAN_DEFAULT, SR_SOFTMAX = "laplacian_default", "sr_softmax"
REFERENCES = {LAPLACIAN_DEFAULT: ("laplacian", dict(SCALE)), SR_SOFTMAX: ("softmax", {})}
"""The confirmation's references: the Laplacian default of 0.2 (λ = 4, 1/N) and SR-softmax."""


def protocol_head_dim(protocol: dict) -> int:
    """The head dim d of the protocol's model (one for every stage, or ValueError): what the defaults read."""
    from ..models.registry import model_config

    cfg = model_config(protocol["recipe"]["model"])
    dims = {c // h for c, h in zip(cfg["embed_dims"], cfg["num_heads"])}
    if len(dims) != 1:
        raise ValueError(f"model: the kernel study needs one head dim for every stage, got {sorted(dims)}")
    return dims.pop()


def bandwidths(family: str) -> tuple[float, ...]:
    """The λ of the sweep of ``family``: ``MATCHED_LAMBDAS`` times ``LAMBDA_FACTORS``, plus ``EXTRA_LAMBDAS``,
    sorted, two significant digits."""
    lam = MATCHED_LAMBDAS[family]
    return tuple(sorted({float(f"{lam * f:.2g}") for f in LAMBDA_FACTORS} | set(EXTRA_LAMBDAS.get(family, ()))))


def matched_bandwidths(protocol: dict, images: int = 64, seed: int = 0) -> dict[str, float]:
    """``MATCHED_LAMBDAS`` recomputed: the protocol's model at initialisation (``seed``) on the first ``images``
    test images; per family, bisection on λ for the median of k(K, L) over stage 1's first attention layer
    (each family on q, k scaled by its default qk_scale) equal to the Laplacian default's (λ = 4)."""
    import torch

    from ..data import build_datasets
    from ..layers.laplacian_attention import LaplacianAttention
    from ..models import create_model
    from ..ops.pooling import pool_landmarks
    from ..train.augment import normalize
    from ..train.geometry import model_kwargs_for

    rec = protocol["recipe"]
    data = build_datasets(rec["data"], rec["img_size"], seed=seed)
    x = normalize(torch.stack([data.test[i][0] for i in range(images)]), data.test.mean, data.test.std)
    torch.manual_seed(seed)
    model = create_model(rec["model"], num_classes=10, in_chans=x.shape[1],
                         **model_kwargs_for(rec.get("model_kwargs"), rec["img_size"])).eval()
    caught = []
    layer = next(m for m in model.modules() if isinstance(m, LaplacianAttention))
    handle = layer.register_forward_hook(lambda mod, inp, out: caught.append(inp))
    with torch.no_grad():
        model(x)
    handle.remove()
    tokens, hw = caught[0][0], caught[0][1]
    b, n, c = tokens.shape
    h = layer.num_heads
    with torch.no_grad():
        qk = layer.qkv(tokens)[..., : 2 * c].reshape(b, n, 2, h, c // h).permute(2, 0, 3, 1, 4)
    q, k = qk[0], qk[1]
    marks = pool_landmarks(q, hw, layer.settings.landmarks)
    medians = {}
    for family in SHIPPED:
        spec = kernel_spec(family)
        s = spec.default_qk_scale(c // h)
        diff = (k * s).unsqueeze(-2) - (marks * s).unsqueeze(-3)
        acc = diff.abs().sum(-1) if spec.l1 else diff.square().sum(-1)
        medians[family] = lambda lam, acc=acc, spec=spec: spec.kernel_of(acc, 1.0 / lam).median().item()
    target = medians["laplacian"](4.0)
    out = {}
    for family, med in medians.items():
        lo, hi = 1e-4, 1e4
        for _ in range(80):
            mid = (lo * hi) ** 0.5
            lo, hi = (lo, mid) if med(mid) > target else (mid, hi)
        out[family] = float(f"{mid:.2g}")
    return out


def label(family: str, lam: float) -> str:
    return f"{family}@lam={lam:g}"


def configuration(lb: str) -> tuple[str, dict]:
    """(attn, attn_kwargs) of a study label ``FAMILY@lam=X`` or a reference; ValueError naming the label."""
    if lb in REFERENCES:
        return REFERENCES[lb]
    family, sep, lam = lb.partition("@lam=")
    try:
        kernel_spec(family)
        value = float(lam)
    except ValueError:
        value = None
    if not sep or value is None or value <= 0:
        raise ValueError(f"label: expected FAMILY@lam=X with FAMILY one of {list(SHIPPED)} or one of "
                         f"{list(REFERENCES)}, got {lb!r}")
    return family, {"lam": value, **SCALE}


def selection_labels(families=SHIPPED) -> list[str]:
    return [label(f, lam) for f in families for lam in bandwidths(f)]


def _shown(path: Path) -> str:
    """``path`` relative to the current directory when it lies under it (recorded in committed files)."""
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def _borrowed(source: Path, protocol: dict, head_dim: int) -> dict:
    """{(canonical settings JSON, seed): (key, cell)} of the cells of ``source`` under the same protocol."""
    rec = read_json(source)
    if not isinstance(rec, dict) or not same_protocol(rec.get("protocol"), protocol):
        return {}
    return {(json.dumps(canonical_attention(c["attn"], c["attn_kwargs"], head_dim), sort_keys=True), c["seed"]): (k, c)
            for k, c in rec.get("cells", {}).items() if c.get("val_top1") is not None}


def run_cells(labels: list[str], seeds: list[int], *, protocol: dict, out: Path, runs: Path, jobs: int = 1,
              borrow: Path | None = Path(BORROW_FROM), train_fn=None, split: dict | None = None,
              progress: bool = True) -> dict:
    """Trains the missing (label, seed) cells, seed-major, after taking those already trained in ``borrow``;
    returns OUT/cells.json's record (written after every cell). ``train_fn(config) -> result`` replaces the
    training (tests)."""
    path = out / "cells.json"
    record = open_cells(path, protocol, split)
    head_dim = protocol_head_dim(protocol)
    borrowed = _borrowed(borrow, protocol, head_dim) if borrow is not None else {}
    todo = []
    for seed in seeds:
        for lb in labels:
            key = cell_key(lb, seed)
            if key in record["cells"]:
                continue
            attn, kwargs = configuration(lb)
            same = borrowed.get((json.dumps(canonical_attention(attn, kwargs, head_dim), sort_keys=True), seed))
            if same is not None:
                record["cells"][key] = {**same[1], "label": lb, "reused_from": f"{_shown(borrow)}#{same[0]}"}
                continue
            config = {**protocol["recipe"], "attn": attn, "attn_kwargs": kwargs, "seed": seed, "progress": False,
                      "out": str(runs / f"{lb.replace('@', '-')}-s{seed}"), "resume": True, "final_test": True}
            todo.append((key, config))
    return record_cells(todo, record, path, configuration, jobs=jobs, train_fn=train_fn, progress=progress,
                        name="kernels")


def _per_seed(record: dict, lb: str, field: str) -> dict[int, float]:
    return {c["seed"]: float(c[field]) for c in record["cells"].values()
            if c["label"] == lb and c.get(field) is not None}


def selection(record: dict, head_dim: int) -> dict:
    """Per family: each λ's validation top-1 on the seeds every λ of the family has (per seed, mean, n), and the
    selected λ (once those common seeds number >= MIN_SELECT_SEEDS: the highest mean; ties: the smaller λ).
    The confirmation's extra seeds of the selected λ are left out, so confirming never moves the selection.
    Reads ``val_top1`` only, never ``test_top1``."""
    families = {}
    for family in SHIPPED:
        rows = {}
        per_lam = on_common_seeds({lam: _per_seed(record, label(family, lam), "val_top1") for lam in bandwidths(family)})
        for lam in bandwidths(family):
            vals = per_lam[lam]
            d = describe(list(vals.values()))
            rows[f"{lam:g}"] = {"label": label(family, lam), "lam": lam, "val_top1": {str(s): v for s, v in sorted(vals.items())},
                                "n": d.n, "mean": d.mean, "std": d.std}
        eligible = [r for r in rows.values() if r["n"] >= MIN_SELECT_SEEDS]
        complete = len(eligible) == len(rows)  # a λ is selected once every λ of the family has its seeds
        best = max(eligible, key=lambda r: (r["mean"], -r["lam"])) if complete else None
        families[family] = {"default_lam": kernel_spec(family).default_lam(head_dim),
                            "matched_lam": MATCHED_LAMBDAS[family], "lambdas": rows,
                            "selected": None if best is None else best["label"],
                            "selected_lam": None if best is None else best["lam"],
                            "complete": complete}
    return {"protocol": record["protocol"], "validation_split": record.get("validation_split"), "head_dim": head_dim,
            "rule": f"per family, on the seeds every one of its λ has (>= {MIN_SELECT_SEEDS}), the λ of the highest "
                    "mean validation top-1 (ties: the smaller λ)", "families": families,
            "complete": all(f["complete"] for f in families.values())}


def confirmation(record: dict, sel: dict) -> dict:
    """Test top-1 of each family at its selected λ and of the references; per family the paired Δ against the
    Laplacian default and against SR-softmax with 95 % CIs; the verdict reads "the family beats the reference"
    (``stats.verdict`` with side +1: reproduced = wins, reversed = loses)."""
    rows, pairs = {}, []
    chosen = {f: e["selected"] for f, e in sel["families"].items() if e["selected"] is not None}
    for lb in [*chosen.values(), *REFERENCES]:
        vals = _per_seed(record, lb, "test_top1")
        d = describe(list(vals.values()))
        attn, kwargs = configuration(lb)
        rows[lb] = {"attn": attn, "attn_kwargs": jsonable(kwargs), "test_top1": {str(s): v for s, v in sorted(vals.items())},
                    "n": d.n, "mean": d.mean, "std": d.std}
    for family, lb in chosen.items():
        for ref in REFERENCES:
            ci = paired(_per_seed(record, lb, "test_top1"), _per_seed(record, ref, "test_top1"))
            pairs.append({"family": family, "a": lb, "b": ref, "n": ci.n, "mean": ci.mean, "ci95": ci.ci,
                          "halfwidth": ci.halfwidth, "verdict": verdict(ci, 1)})
    return {"protocol": record["protocol"], "chosen": chosen, "configurations": rows, "pairs": pairs,
            "complete": bool(chosen) and all(r["n"] >= CONFIRM_SEEDS for r in rows.values())}


def detection_variants(sel: dict) -> dict[str, dict]:
    """{label: backbone_kwargs} of the best two non-Laplacian families at their selected λ, ranked by the
    selected λ's mean validation top-1; empty while the selection is incomplete."""
    if not sel.get("complete"):
        return {}
    ranked = sorted(((e["lambdas"][f"{e['selected_lam']:g}"]["mean"], f) for f, e in sel["families"].items()
                     if f != "laplacian" and e["selected"] is not None), reverse=True)
    out = {}
    for _, family in ranked[:2]:
        attn, kwargs = configuration(sel["families"][family]["selected"])
        out[f"kernel_{family}"] = {"attn": attn, "attn_kwargs": kwargs}
    return out


VERDICT_WORDS = {"reproduced": "wins", "reversed": "loses", "not_reproduced": "no difference (< 0.5 pt)",
                 "undecided": "undecided"}


def selection_markdown(sel: dict) -> str:
    rows = []
    for family, e in sel["families"].items():
        for key, r in e["lambdas"].items():
            rows.append([family, f"{r['lam']:g}" + (" (matched)" if r["lam"] == e["matched_lam"] else ""),
                         r["n"], _pts(r["mean"]), _pts(r["std"]), "**selected**" if r["label"] == e["selected"] else ""])
    split = sel.get("validation_split") or {}
    head = (f"Bandwidth selection per kernel family on validation data ({sel['protocol']['name']}: "
            f"{split.get('holdout')} of {split.get('train_items')} training images held out, sha256 "
            f"{str(split.get('indices_sha256'))[:12]}…; injective normalisation, output scale 1/N). Rule: {sel['rule']}."
            f"{'' if sel['complete'] else ' Incomplete: a family without 3 seeds at each of its λ has no selection yet.'}")
    return head + "\n\n" + markdown_table(["family", "λ", "seeds", "val top-1 %", "std", ""], rows)


def confirmation_markdown(conf: dict, sel: dict) -> str:
    rows = []
    for family, lb in conf["chosen"].items():
        c = conf["configurations"][lb]
        by_ref = {p["b"]: p for p in conf["pairs"] if p["a"] == lb}
        cells = [family, f"{sel['families'][family]['selected_lam']:g}",
                 _pts(sel["families"][family]["lambdas"][f"{sel['families'][family]['selected_lam']:g}"]["mean"]),
                 c["n"], _pts(c["mean"])]
        for ref in REFERENCES:
            p = by_ref[ref]
            cells += ["–" if p["mean"] is None else f"{100 * p['mean']:+.2f}", _ci(p["ci95"]),
                      VERDICT_WORDS.get(p["verdict"], p["verdict"])]
        rows.append(cells)
    refs = "; ".join(f"{lb}: {_pts(c['mean'])} % (n = {c['n']})" for lb, c in conf["configurations"].items()
                     if lb in REFERENCES)
    table = markdown_table(["family", "λ (selected)", "val top-1 %", "test seeds", "test top-1 %",
                            "Δ vs Laplacian default", "95 % CI", "verdict", "Δ vs SR-softmax", "95 % CI", "verdict"], rows)
    return (f"Kernel families on the test set, each at its validation-selected λ{'' if conf['complete'] else ' (incomplete)'}. "
            f"References: {refs}. Δ in points, paired by seed; verdict: the family against the reference.\n\n{table}")


def _plot(path: Path, sel: dict) -> None:
    """Validation top-1 against λ (log scale), one line per family, seeds as dots; the selected λ ringed."""
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for family, e in sel["families"].items():
        pts = [(r["lam"], r["mean"], list(r["val_top1"].values())) for r in e["lambdas"].values() if r["n"]]
        if not pts:
            continue
        line, = ax.plot([p[0] for p in pts], [100 * p[1] for p in pts], "-o", ms=4, label=family)
        for lam, _, vals in pts:
            ax.plot([lam] * len(vals), [100 * v for v in vals], ".", color=line.get_color(), alpha=0.4, ms=3)
        if e["selected_lam"] is not None:
            r = e["lambdas"][f"{e['selected_lam']:g}"]
            ax.plot([r["lam"]], [100 * r["mean"]], "o", ms=10, mfc="none", color=line.get_color())
    ax.set_xscale("log")
    ax.set_xlabel("λ (bandwidth on q, k scaled by the family's qk_scale)")
    ax.set_ylabel("validation top-1 (%)")
    ax.set_title("kernel families: bandwidth sweep on validation (ringed: selected)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_reports(out: Path, head_dim: int) -> dict:
    """selection.{json,md,png} and confirmation.{json,md} from OUT/cells.json."""
    record = read_json(out / "cells.json")
    if record is None:
        raise ValueError(f"out: {out / 'cells.json'} does not exist (no cells recorded yet)")
    sel = selection(record, head_dim)
    write_json(out / "selection.json", sel)
    (out / "selection.md").write_text(selection_markdown(sel) + "\n")
    _plot(out / "selection.png", sel)
    conf = confirmation(record, sel)
    write_json(out / "confirmation.json", conf)
    (out / "confirmation.md").write_text(confirmation_markdown(conf, sel) + "\n")
    return {"selection": sel, "confirmation": conf}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laplacianformer kernels",
                                description="The kernel families of the attention under the validated protocol: "
                                            "bandwidth selection on validation, confirmation on test (docs/DESIGN.md "
                                            "§7.8); resumable per cell.")
    p.add_argument("stage", choices=("select", "confirm", "report", "list", "variants", "calibrate", "why"),
                   help="calibrate: recompute the matched bandwidths (MATCHED_LAMBDAS) and print them; why: "
                        "distances, kernel values and Nystrom error of each family's model (options: kernels why --help)")
    p.add_argument("--families", nargs="+", default=list(SHIPPED), choices=list(SHIPPED),
                   help="select/confirm: only these families (default: all shipped)")
    p.add_argument("--seeds", type=int, default=None, help=f"seeds 0..N-1 (select {SELECT_SEEDS}, confirm {CONFIRM_SEEDS})")
    p.add_argument("--jobs", type=int, default=1, help="cells at once, each a single-threaded process")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"results directory (default {DEFAULT_OUT})")
    p.add_argument("--runs", default=DEFAULT_RUNS, help=f"per-cell run directories (default {DEFAULT_RUNS})")
    p.add_argument("--borrow", default=BORROW_FROM,
                   help=f"cells.json of the same protocol to take identical cells from (default {BORROW_FROM}; '' for none)")
    return p


def _stage(args) -> int:
    out, runs = Path(args.out), Path(args.runs)
    if args.jobs < 1:
        raise ValueError(f"jobs: expected >= 1, got {args.jobs}")
    protocol = build_protocol(PROTOCOL_NAME, VAL_PROTOCOL)
    head_dim = protocol_head_dim(protocol)
    if args.stage == "list":
        for lb in selection_labels() + list(REFERENCES):
            attn, kw = configuration(lb)
            print(f"{lb:26s} {attn:12s} {json.dumps(kw)}")
        return 0
    if args.stage == "calibrate":
        found = matched_bandwidths(protocol)
        for family, lam in found.items():
            print(f"{family:12s} matched λ {lam:g} (table: {MATCHED_LAMBDAS[family]:g})")
        return 0
    if args.stage == "variants":
        for lb, kwargs in detection_variants(read_json(out / "selection.json") or {}).items():
            print(lb, json.dumps(kwargs, separators=(",", ":"), sort_keys=True))
        return 0
    if args.stage in ("select", "confirm"):
        if args.stage == "select":
            labels, seeds = selection_labels(args.families), args.seeds or SELECT_SEEDS
        else:
            sel = read_json(out / "selection.json")
            if not sel:
                raise ValueError(f"out: no selection yet in {out / 'selection.json'}; run 'select' first")
            labels = [sel["families"][f]["selected"] for f in args.families if sel["families"][f]["selected"]]
            labels += list(REFERENCES)
            seeds = args.seeds or CONFIRM_SEEDS
        start = time.perf_counter()
        run_cells(labels, list(range(seeds)), protocol=protocol, out=out, runs=runs, jobs=args.jobs,
                  borrow=Path(args.borrow) if args.borrow else None, split=validation_split(protocol["recipe"]))
        print(f"{_fmt_time(time.perf_counter() - start)}; wrote {out}/", flush=True)
    done = write_reports(out, head_dim)
    print(selection_markdown(done["selection"]))
    print("\n" + confirmation_markdown(done["confirmation"], done["selection"]))
    return 0


def why_study():
    """What ``kernel_why`` reads of this study (it does not import this module: no cycle)."""
    from .kernel_why import Study

    return Study(matched=MATCHED_LAMBDAS, label=label, configuration=configuration, selection=selection,
                 confirmation=confirmation, head_dim=protocol_head_dim)


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] == ["why"]:
        from .kernel_why import main as why_main

        return why_main(argv[1:], study=why_study())
    args = build_parser().parse_args(argv)
    return run_command("kernels", lambda: _stage(args))


if __name__ == "__main__":
    raise SystemExit(main())
