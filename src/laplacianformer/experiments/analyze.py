"""``laplacianformer analyze WHAT``: the solver study and the attention analyses, with plots.

    analyze solver   [--checkpoint RUN]   NS vs CG residual vs iterations (synthetic SPD, synthetic and model W)
    analyze distances --checkpoint RUN    query–key L1 / squared-L2 distance distributions per stage
    analyze maps      --checkpoint RUN    attention rows: exact Laplacian vs Nyström-Laplacian vs Gaussian
    analyze spectrum  --checkpoint RUN    singular-value profiles of the similarity matrices
    analyze nystrom   --checkpoint RUN    Nyström approximation error vs landmark count
    analyze gain      --checkpoint RUN    output RMS / V RMS of each normalisation variant, per module
    analyze all       --checkpoint RUN    everything above

RUN is a training run directory (``laplacianformer train --out RUN``) or its checkpoint file; the model
is evaluated on the first ``--images`` test images of the run's data set.  ``--untrained`` uses a freshly
initialised micro model instead (for smoke tests; its plots say so).  Each analysis writes
OUT/<what>.json, .md and .png (default OUT: results/analysis).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from . import analysis, solver_study
from .common import environment, markdown_table, pyplot, write_json

WHAT = ("solver", "distances", "maps", "spectrum", "nystrom", "gain", "gain-tokens")
# (image side, stem stride) of the micro model giving 49, 196, 1,024, 4,096 and 16,384 stage-1 tokens (only
# stage 1 runs, so 14 px need not pass the whole model's minimum size)
GAIN_POINTS = ((14, 2), (28, 2), (64, 2), (128, 2), (256, 2))
DEFAULT_OUT = "results/analysis"


def load_trained(checkpoint: str, images: int):
    """(model in eval mode, normalised test images (images, C, S, S), description) from a training run."""
    from ..data import build_datasets
    from ..train import build_model, read_train_config
    from ..train.augment import normalize
    from ..hub import load_model_state
    from ..train.engine import read_resume

    ckpt, state = read_resume(checkpoint)
    cfg = read_train_config(ckpt.parent)
    splits = build_datasets(cfg.data, cfg.img_size, in_chans=cfg.in_chans, test_subset=max(images, 16), seed=0)
    model = build_model(cfg, len(splits.classes), splits.in_chans)
    load_model_state(model, state["model"], str(ckpt))
    test = splits.test
    x = normalize(test.images[:images], test.mean, test.std)
    desc = f"{cfg.model} attn={cfg.attn} {cfg.attn_kwargs or ''} trained {cfg.epochs} ep on {cfg.data} ({ckpt})"
    return model.eval(), x, desc


def load_untrained(images: int, img_size: int = 32, stem_stride: int = 2):
    """A freshly initialised micro model (stem stride 2) and Fashion-MNIST test images: smoke tests, and the
    state at initialisation (``gain``)."""
    from ..data import build_datasets
    from ..models import create_model
    from ..train.augment import normalize

    torch.manual_seed(0)
    splits = build_datasets("fashion-mnist", img_size, test_subset=max(images, 16), train_subset=16, seed=0)
    model = create_model("laplacianformer_micro", num_classes=10, in_chans=1, stem_stride=stem_stride)
    x = normalize(splits.test.images[:images], splits.test.mean, splits.test.std)
    return model.eval(), x, f"UNTRAINED laplacianformer_micro (random init, stem stride {stem_stride}, {img_size} px Fashion-MNIST)"


def _save(out: Path, what: str, payload: dict, table: str) -> None:
    write_json(out / f"{what}.json", payload)
    (out / f"{what}.md").write_text(f"### analysis `{what}`\n\n{payload.get('model', '')}\n\n{table}\n")
    print(f"\n### analysis `{what}`\n\n{table}\n\nwrote {out / what}.json, .md, .png")


def run_solver(out: Path, records, quick: bool, desc: str) -> None:
    fams = solver_study.standard_families(
        kappas=(1e1, 1e4) if quick else solver_study.DEFAULT_KAPPAS, lams=(4.0,) if quick else (1.0, 4.0, 8.0),
        batch=2 if quick else 8,
    )
    if records:
        fams.update({k: v[:64] for k, v in analysis.landmark_matrices_from(records).items()})
    iters = (1, 5, 10, 20) if quick else solver_study.DEFAULT_ITERS
    study = solver_study.run_solver_study(fams, iters)
    study.update({"model": desc, "environment": environment()})
    solver_study.plot_solver_study(study, out / "solver.png")
    _save(out, "solver", study, solver_study.solver_table(study))


def run_distances(out: Path, records, desc: str) -> None:
    stats = analysis.distance_stats(records)
    plt = pyplot()
    fig, axes = plt.subplots(1, len(stats), figsize=(3.6 * len(stats), 3.4), squeeze=False)
    rows = []
    for ax, s in zip(axes[0], stats):
        for key, label in (("l1", "L1"), ("sq_l2", "squared L2")):
            edges = s[key]["hist_edges_over_median"]
            centres = [(a + b) / 2 for a, b in zip(edges[:-1], edges[1:])]
            ax.semilogy(centres, [v if v > 0 else float("nan") for v in s[key]["hist_density"]], label=label)
            rows.append([s["name"], f"{s['hw'][0]}x{s['hw'][1]}", label, f"{s[key]['median']:.3g}",
                         f"{s[key]['p99_over_median']:.2f}", f"{s[key]['excess_kurtosis']:.2f}",
                         f"{100 * s[key]['kernel_below_1e-3']:.2f}"])
        ax.set_title(f"{s['name']}\n{s['hw'][0]}x{s['hw'][1]} tokens", fontsize=8)
        ax.set_xlabel("distance / median")
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("density")
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"query–key distances ({desc[:90]})", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "distances.png", dpi=110)
    plt.close(fig)
    header = ["module", "tokens", "distance", "median", "p99 / median", "excess kurtosis", "% pairs exp(-D/lam) < 1e-3"]
    _save(out, "distances", {"model": desc, "modules": stats, "environment": environment()}, markdown_table(header, rows))


def _nystrom_records(records) -> list[dict]:
    nys = [r for r in records if r["landmarks"] is not None]
    return nys or records[:1]


def run_maps(out: Path, records, images, desc: str) -> None:
    res = [analysis.attention_rows(r, max_images=min(4, images.shape[0])) for r in _nystrom_records(records)]
    first = res[0]
    n_img = len(first["rel_error_nystrom"])
    plt = pyplot()
    cols = ["image"] + list(first["maps"])
    fig, axes = plt.subplots(n_img, len(cols), figsize=(2.4 * len(cols), 2.4 * n_img), squeeze=False)
    h, w = first["hw"]
    qy, qx = divmod(first["query"], w)
    for i in range(n_img):
        axes[i][0].imshow(images[i, 0].numpy(), cmap="gray")
        axes[i][0].set_title("input" if i == 0 else "", fontsize=8)
        for j, key in enumerate(first["maps"], start=1):
            axes[i][j].imshow(first["maps"][key][i], cmap="magma")
            axes[i][j].plot([qx], [qy], "c+", ms=8)
            if i == 0:
                axes[i][j].set_title(key, fontsize=8)
        for ax in axes[i]:
            ax.set_xticks([])
            ax.set_yticks([])
    fig.suptitle(f"{first['name']}: attention row of the centre query (+), norm={first['norm']}, "
                 f"{first['landmarks'][0]}x{first['landmarks'][1]} landmarks", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "maps.png", dpi=110)
    plt.close(fig)
    rows = [[r["name"], f"{r['hw'][0]}x{r['hw'][1]}", f"{r['landmarks'][0]}x{r['landmarks'][1]}", r["norm"],
             ", ".join(f"{e:.3f}" for e in r["rel_error_nystrom"])] for r in res]
    header = ["module", "tokens", "landmarks", "norm", "relative L2 error of the Nyström row, per image"]
    _save(out, "maps", {"model": desc, "modules": res, "environment": environment()}, markdown_table(header, rows))


def run_spectrum(out: Path, records, desc: str) -> None:
    res = [analysis.singular_values(r) for r in records if r["hw"][0] * r["hw"][1] >= 16]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(res), figsize=(3.6 * len(res), 3.4), squeeze=False)
    rows = []
    for ax, r in zip(axes[0], res):
        for key, prof in r["profiles"].items():
            ax.semilogy(range(1, len(prof) + 1), [max(p, 1e-12) for p in prof], label=key)
            rows.append([r["name"], f"{r['hw'][0]}x{r['hw'][1]}", key, f"{r['effective_rank'][key]:.1f}",
                         r["count_above_1e-2"][key]])
        ax.set_title(f"{r['name']}\n{r['hw'][0]}x{r['hw'][1]} tokens", fontsize=8)
        ax.set_xlabel("index i")
        ax.set_ylim(1e-8, 1.5)
        ax.grid(True, alpha=0.3)
    axes[0][0].set_ylabel("sigma_i / sigma_1 (mean over images, heads)")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "spectrum.png", dpi=110)
    plt.close(fig)
    header = ["module", "tokens", "matrix", "effective rank", "# sigma_i / sigma_1 > 1e-2"]
    _save(out, "spectrum", {"model": desc, "modules": res, "environment": environment()}, markdown_table(header, rows))


def run_nystrom(out: Path, records, desc: str, quick: bool) -> None:
    res = [analysis.nystrom_error(r, sides=[2, 4] if quick else None) for r in _nystrom_records(records)]
    plt = pyplot()
    fig, axes = plt.subplots(1, len(res), figsize=(4.2 * len(res), 3.6), squeeze=False)
    rows = []
    for ax, r in zip(axes[0], res):
        for key, errs in r["errors"].items():
            ax.semilogy(r["m"], errs, "o-" if "laplacian" in key else "s--", label=key, ms=3)
            rows.append([r["name"], f"{r['hw'][0]}x{r['hw'][1]}", key] + [f"{e:.2e}" for e in errs])
        ax.set_title(f"{r['name']} ({r['hw'][0]}x{r['hw'][1]} tokens)", fontsize=8)
        ax.set_xlabel("landmarks m")
        ax.grid(True, which="both", alpha=0.3)
    axes[0][0].set_ylabel("||G - C W+ C^T||_F / ||G||_F")
    axes[0][0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out / "nystrom.png", dpi=110)
    plt.close(fig)
    header = ["module", "tokens", "kernel, inverse"] + [f"m={m}" for m in res[0]["m"]]
    _save(out, "nystrom", {"model": desc, "modules": res, "environment": environment()}, markdown_table(header, rows))


def run_gain(out: Path, records, desc: str) -> None:
    res = analysis.output_gain(records)
    norms = list(res[0]["gain"])
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(1.2 + 1.3 * len(res), 3.6))
    width = 0.8 / len(norms)
    for i, norm in enumerate(norms):
        ax.bar([j + (i - (len(norms) - 1) / 2) * width for j in range(len(res))], [r["gain"][norm] for r in res],
               width, label=norm)
    ax.set_xticks(range(len(res)))
    ax.set_xticklabels([f"{r['name']}\n{r['tokens']} tokens" for r in res], fontsize=6)
    ax.set_yscale("log")
    ax.set_ylabel("RMS(output) / RMS(V)")
    ax.axhline(1.0, color="k", lw=0.5)
    ax.legend(fontsize=7)
    ax.set_title(f"attention output gain per normalisation ({desc[:80]})", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "gain.png", dpi=110)
    plt.close(fig)
    rows = [[r["name"], r["tokens"], "exact" if r["landmarks"] is None else f"{r['landmarks'][0]}x{r['landmarks'][1]}"]
            + [f"{r['gain'][n]:.3g}" for n in norms]
            + [f"{r['key_scale_spread']['p99_over_median']:.3g}", f"{r['key_scale_spread']['max_over_median']:.3g}"]
            for r in res]
    header = (["module", "tokens", "landmarks"] + [f"gain {n}" for n in norms]
              + ["injective r_j p99 / median", "max / median"])
    _save(out, "gain", {"model": desc, "modules": res, "environment": environment()}, markdown_table(header, rows))


def run_gain_tokens(out: Path, images: int, points=GAIN_POINTS) -> dict:
    """Output gain at initialisation against the stage-1 token count (docs/DESIGN.md §4.6): the untrained micro
    model at each (image side, stem stride) of ``points``, gain of every variant on its stage-1 modules
    (mean over them), and the operator's output std for unit-variance random q, k, v at the same token
    counts. Writes gain_tokens.json / .md / .png (log–log)."""
    rows = []
    for size, stem in points:
        model, x, _ = load_untrained(images, size, stem)
        records = analysis.capture_qk(model, x, run=lambda images: model.stages[0](model.patch_embed(images)))
        per_module = [analysis.variant_gain(r) for r in records]
        gain = {lb: sum(g[lb] for g in per_module) / len(per_module) for lb in per_module[0]}
        tokens = records[0]["hw"][0] * records[0]["hw"][1]
        rows.append({"img_size": size, "stem_stride": stem, "tokens": tokens, "modules": [r["name"] for r in records],
                     "landmarks": None if records[0]["landmarks"] is None else list(records[0]["landmarks"]),
                     "model_gain": gain, "synthetic_std": analysis.synthetic_gain(tokens)})
        print(f"gain-tokens: {tokens} tokens done", flush=True)
    labels = list(rows[0]["model_gain"])
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    toks = [r["tokens"] for r in rows]
    for lb in labels:
        axes[0].plot(toks, [r["model_gain"][lb] for r in rows], "o-", label=lb)
    for lb in list(rows[0]["synthetic_std"]):
        axes[1].plot(toks, [r["synthetic_std"][lb] for r in rows], "o-", label=lb)
    ref = [rows[0]["model_gain"]["injective"] * (t / toks[0]) ** 0.5 for t in toks]
    axes[0].plot(toks, ref, "k:", lw=0.8, label="∝ √N")
    for ax, title, ylab in ((axes[0], "micro at init, stage 1 (mean over its modules)", "RMS(output) / RMS(V)"),
                            (axes[1], "operator, unit-variance q, k, v (B1 H2 d32)", "output std")):
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("stage-1 tokens N")
        ax.set_ylabel(ylab)
        ax.set_title(title, fontsize=9)
        ax.axhline(1.0, color="k", lw=0.4)
        ax.legend(fontsize=6)
    fig.tight_layout()
    fig.savefig(out / "gain_tokens.png", dpi=110)
    plt.close(fig)
    table = markdown_table(["tokens", "img px / stem", "landmarks"] + [f"model {lb}" for lb in labels],
                           [[r["tokens"], f"{r['img_size']} / {r['stem_stride']}", "exact" if r["landmarks"] is None else "x".join(map(str, r["landmarks"]))]
                            + [f"{r['model_gain'][lb]:.3g}" for lb in labels] for r in rows])
    syn = list(rows[0]["synthetic_std"])
    table += "\n\n" + markdown_table(["tokens"] + [f"operator std {lb}" for lb in syn],
                                      [[r["tokens"]] + [f"{r['synthetic_std'][lb]:.3g}" for lb in syn] for r in rows])
    payload = {"model": "UNTRAINED laplacianformer_micro (seed 0) on Fashion-MNIST test images",
               "images": images, "rows": rows, "environment": environment()}
    _save(out, "gain_tokens", payload, table)
    return payload


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="laplacianformer analyze", description=__doc__.split("\n\n")[0])
    p.add_argument("what", choices=WHAT + ("all",), help="which analysis")
    p.add_argument("--checkpoint", default=None, help="training run directory or checkpoint file")
    p.add_argument("--untrained", action="store_true", help="use a randomly initialised micro model (smoke test)")
    p.add_argument("--images", type=int, default=8, help="test images fed to the model (default 8)")
    p.add_argument("--img-size", type=int, default=32,
                   help="image side of the --untrained model's inputs (default 32; the ablation protocol uses 28)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"output directory (default {DEFAULT_OUT})")
    p.add_argument("--quick", action="store_true", help="reduced sizes (smoke test)")
    p.add_argument("--threads", type=int, default=None, help="torch threads")
    return p


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    if args.images < 1:
        print(f"analyze: images: expected an integer >= 1, got {args.images}", file=sys.stderr)
        return 2
    what = list(WHAT) if args.what == "all" else [args.what]
    needs_model = any(w not in ("solver", "gain-tokens") for w in what)
    if needs_model and not (args.checkpoint or args.untrained):
        print(f"analyze: checkpoint: '{args.what}' needs --checkpoint RUN (a training run) or --untrained", file=sys.stderr)
        return 2
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    records, images, desc = None, None, "no model (synthetic matrices only)"
    if args.checkpoint or args.untrained:
        try:
            model, images, desc = (load_trained(args.checkpoint, args.images) if args.checkpoint
                                   else load_untrained(args.images, args.img_size))
            records = analysis.capture_qk(model, images)
        except ValueError as exc:
            print(f"analyze: {exc}", file=sys.stderr)
            return 2
    for w in what:
        if w == "solver":
            run_solver(out, records, args.quick, desc)
        elif w == "distances":
            run_distances(out, records, desc)
        elif w == "maps":
            run_maps(out, records, images, desc)
        elif w == "spectrum":
            run_spectrum(out, records, desc)
        elif w == "gain":
            run_gain(out, records, desc)
        elif w == "gain-tokens":
            run_gain_tokens(out, min(args.images, 4) if args.quick else args.images,
                            GAIN_POINTS[:2] if args.quick else GAIN_POINTS)
        else:
            run_nystrom(out, records, desc, args.quick)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
