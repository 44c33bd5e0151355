"""Where a backbone's time goes: one attention layer per stage, laplacian vs gaussian vs softmax (any kernel family
with --attn), side by side.

    python -m laplacianformer.bench.stage_attention                          # Tiny's four stages at 512², CPU
    python -m laplacianformer.bench.stage_attention --retain-heap            # steady state (see bench/allocator.py)
    python -m laplacianformer.bench.stage_attention --size 1024 --device cuda --batch 8
    python -m laplacianformer.bench.stage_attention --retain-heap --normalization fused  # before the C backend

For each stage of the backbone (default Tiny) the first block's attention layer, as the backbone builds it
(widths, heads, landmarks; spatial-reduction ratios 8/4/2/1 for softmax), runs on random tokens of the shape
that stage sees at ``--size`` (recorded from a forward of the whole model). Inference: the layer's forward
under no_grad; training: forward and backward of the sum of its output (input and weight gradients).
The variants of one (stage, mode) are timed round-robin. With "laplacian" among the variants a second table
splits that layer's inference time into its steps (``laplacian_pieces``). MACs follow ``laplacianformer.models.count_macs``
(matmuls, convolutions, SDPA, and N·M·d per L1 distance matrix); MACs per second says how well each layer
uses the machine (the Laplacian layer does fewer MACs than spatial-reduction softmax at 512², in smaller
products). ``--normalization NAME`` forces that backend of the normalization op process-wide (``ops.configure``;
the table in docs/KERNELS.md "Backends and dispatch"), so a layer's time can be compared with and without the
fused C normalisation. Writes runs/bench/stage_attention/stage_attention_<device>[_retain][_norm-NAME].{json,md,png}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from .harness import round_robin, timed_result
from .options import add_model_options, add_round_options, add_timing_options, start_timing_run, write_results
from .report import markdown_table, report_header, write_text
from ..layers.token_mixer import ATTENTIONS
from ..ops.validation import resolve_landmarks
from ..models import count_macs, create_model
from ..ops.attention import pool_landmarks
from ..ops.kernel import laplace_kernel
from ..ops.newton_schulz import regularised_inverse
from ..ops import configure
from ..ops.normalization import normalize_nystrom, scale_whitened


COMPARED = ("laplacian", "gaussian", "softmax")
"""The attentions timed by default: the paper's kernel, the one it is compared with, SR-softmax."""


class LayerOnGrid(torch.nn.Module):
    """An attention layer with its token grid fixed: forward(x (B, N, C)) -> (B, N, C)."""

    def __init__(self, layer: torch.nn.Module, hw: tuple[int, int]):
        super().__init__()
        self.layer, self.hw = layer, hw

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layer(x, self.hw)


def stage_inputs(model: str, size: int) -> list[dict]:
    """Per stage: the (N, C) token shape and (height, width) grid its first attention layer sees at size²."""
    net = create_model(model).eval()
    seen = {}

    def hook(i):
        def record(module, args, kwargs):
            x = args[0]
            hw = args[1] if len(args) > 1 else kwargs.get("hw")
            seen[i] = dict(stage=i, tokens=x.shape[1], channels=x.shape[2], hw=tuple(hw), heads=module.num_heads)
        return record

    handles = [s.blocks[0].attn.register_forward_pre_hook(hook(i), with_kwargs=True) for i, s in enumerate(net.stages)]
    with torch.no_grad():
        net(torch.zeros(1, 3, size, size))
    for h in handles:
        h.remove()
    return [seen[i] for i in sorted(seen)]


def make_layer_case(model: str, attn: str, stage: int, shape: dict, batch: int, mode: str, device: str = "cpu",
                    seed: int = 0):
    """(callable to time, the layer on its grid, the input) for one stage's first attention layer."""
    torch.manual_seed(seed)
    net = create_model(model, attn=attn)
    layer = LayerOnGrid(net.stages[stage].blocks[0].attn, shape["hw"]).to(device)
    x = torch.randn(batch, shape["tokens"], shape["channels"], device=device)
    if mode == "infer":
        layer.eval()

        def run():
            with torch.no_grad():
                return layer(x)

        return run, layer, x
    layer.train()
    x.requires_grad_(True)

    def step():
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out = layer(x)
        out.sum().backward()
        return out

    return step, layer, x


def run(args, shapes: list[dict]) -> list[dict]:
    """Rows of timings and MACs for every stage shape (from ``stage_inputs``), mode and variant."""
    from tqdm import tqdm

    rows = []
    macs = {}
    groups = [(s, m) for s in shapes for m in ("infer", "train")]
    for shape, mode in tqdm(groups, desc="stage_attention"):
        cases = {a: make_layer_case(args.model, a, shape["stage"], shape, args.batch, mode, args.device)
                 for a in args.attn}
        timings = round_robin({a: c[0] for a, c in cases.items()}, device=args.device, repeats=args.repeats,
                              max_seconds=args.max_seconds)
        for attn, (_, layer, x) in cases.items():
            key = (shape["stage"], attn)
            if key not in macs:  # the forward's MACs, the same layer in both modes
                macs[key] = count_macs(layer.cpu().eval(), x.detach().cpu()[:1])[0] * args.batch
            t = timings[attn]
            rows.append(dict(
                model=args.model, size=args.size, stage=shape["stage"], tokens=shape["tokens"],
                channels=shape["channels"], heads=shape["heads"], attn=attn, mode=mode, batch=args.batch,
                median_ms=t.median_ms, iqr_ms=t.iqr_ms, repeats=t.repeats, forward_gmacs=macs[key] / 1e9,
                gmacs_per_s=macs[key] / 1e9 / (t.median_ms / 1e3) if mode == "infer" else None,
            ))
    return rows


def laplacian_pieces(model: str, stage: int, shape: dict, batch: int, device: str = "cpu", repeats: int = 30,
                     seed: int = 0) -> dict:
    """Median ms of each step of one Laplacian layer's inference forward, timed one after another in the order
    the layer runs them: the v and q/k projections, then the steps of ``laplacian_attention`` (landmark pooling,
    W = k(L, L), the Newton–Schulz solve, C_k, C_q, the injective normalisation; the default options:
    injective norm, Newton–Schulz, qk_scale folded into λ), DWConv(V), the head merge, the output projection;
    and the whole layer called as usual ("layer"), which the steps should add up to (their output is checked
    against the layer's). None for a stage whose
    grid has no more tokens than landmarks (the layer then uses the exact kernel, not these steps)."""
    torch.manual_seed(seed)
    layer = create_model(model).stages[stage].blocks[0].attn.to(device).eval()
    opts = layer.attn_kwargs
    if (opts["norm"], opts["solver"], opts["kernel"]) != ("injective", "newton_schulz", "laplacian"):
        raise ValueError("laplacian_pieces: times the default options only")
    hw = shape["hw"]
    x = torch.randn(batch, shape["tokens"], shape["channels"], device=device)
    lam = opts["lam"] / (opts["qk_scale"] or layer.head_dim ** -0.5)
    grid = resolve_landmarks(layer.landmarks, hw, shape["tokens"])
    if grid is None:
        return None
    times: dict[str, list[float]] = {}

    def timed(name, fn, *args):
        out, wall_ms, _ = timed_result(fn, *args, device=device)
        times.setdefault(name, []).append(wall_ms)
        return out

    def steps():
        v_tok = timed("v projection", layer._project_v, x)
        q, k = timed("q, k projections", layer._project_qk, x)
        marks = timed("landmark pooling", pool_landmarks, q, hw, grid)
        w = timed("W = k(L, L)", laplace_kernel, marks, marks, lam)
        w_inv = timed("Newton-Schulz solve", lambda: regularised_inverse(
            w, solver="newton_schulz", iters=opts["iters"], eps=opts["ns_eps"]))
        c_k = timed("C_k = k(K, L)", laplace_kernel, k, marks, lam)
        c_q = timed("C_q = k(Q, L)", laplace_kernel, q, marks, lam)
        v_heads = layer._heads(v_tok)
        heads = timed("injective normalisation", lambda: normalize_nystrom(
            c_q, c_k, v_heads, "injective", 1e-6, w_inv=w_inv))
        heads = timed("output scale (§4.6)", scale_whitened, heads, v_heads, opts["norm_scale"])
        out = timed("DWConv(V)", layer._value_conv, v_tok, hw)
        b, n, c = x.shape
        timed("head merge", lambda: out.view(b, n, layer.num_heads, layer.head_dim).transpose(1, 2).add_(heads))
        y = timed("output projection", layer.proj, out)
        return y, timed("layer", layer, x, hw)

    with torch.no_grad():
        for _ in range(3):
            by_steps, whole = steps()
        # the steps are the layer's own computation, not an approximation of it
        torch.testing.assert_close(by_steps, whole, rtol=1e-4, atol=1e-5)
        times.clear()
        for _ in range(repeats):
            steps()
    return {name: sorted(ts)[len(ts) // 2] for name, ts in times.items()}


def ratios(rows: list[dict]) -> list[dict]:
    """Per (stage, mode), each variant's time and forward MACs relative to softmax, and the sum over stages."""
    key = {(r["stage"], r["mode"], r["attn"]): r for r in rows}
    out = []
    for (stage, mode, attn), r in key.items():
        base = key.get((stage, mode, "softmax"))
        if attn != "softmax" and base is not None:
            out.append(dict(stage=stage, mode=mode, attn=attn, time_vs_softmax=r["median_ms"] / base["median_ms"],
                            macs_vs_softmax=r["forward_gmacs"] / base["forward_gmacs"]))
    for mode in ("infer", "train"):
        total = {a: sum(r["median_ms"] for r in rows if r["attn"] == a and r["mode"] == mode) for a in ATTENTIONS}
        if total.get("softmax"):
            for a in ATTENTIONS:
                if a != "softmax" and total.get(a):
                    out.append(dict(stage="all", mode=mode, attn=a, time_vs_softmax=total[a] / total["softmax"],
                                    macs_vs_softmax=None))
    return out


def plot(path: Path, rows: list[dict], attns, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    stages = sorted({r["stage"] for r in rows})
    fig, axes = plt.subplots(1, 3, figsize=(16, 4.5))
    width = 0.8 / max(1, len(attns))
    panels = [("infer", "median_ms", "inference ms / layer"), ("train", "median_ms", "training step ms / layer"),
              ("infer", "gmacs_per_s", "inference GMAC/s")]
    for ax, (mode, field, label) in zip(axes, panels):
        for i, a in enumerate(attns):
            ys = [next((r[field] for r in rows if r["stage"] == s and r["attn"] == a and r["mode"] == mode), 0) or 0
                  for s in stages]
            ax.bar([s + (i - (len(attns) - 1) / 2) * width for s in stages], ys, width, label=a, color=f"C{i}")
        ax.set_xticks(stages)
        ax.set_xticklabels([f"stage {s + 1}\nN={next(r['tokens'] for r in rows if r['stage'] == s)}" for s in stages])
        ax.set_ylabel(label)
        ax.grid(True, axis="y", alpha=0.3)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="upper right", ncol=len(attns), fontsize=9)
    fig.suptitle(title)
    fig.tight_layout(rect=(0, 0, 1, 0.93))
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    add_model_options(p, batch=1)
    p.add_argument("--size", type=int, default=512)
    p.add_argument("--attn", nargs="+", default=list(COMPARED), choices=list(ATTENTIONS),
                   help=f"attentions to time (default {' '.join(COMPARED)}; any of {', '.join(ATTENTIONS)})")
    add_round_options(p, repeats=15, max_seconds=20.0, per="(stage, mode) group")
    p.add_argument("--normalization", default="auto",
                   help="backend of the normalization op for every layer (auto, cpu, fused, composite, ...)")
    add_timing_options(p)
    args = p.parse_args(argv)
    configure(normalization=args.normalization)
    load_before = start_timing_run(args, "laplacianformer.bench.stage_attention", argv)
    shapes = stage_inputs(args.model, args.size)
    rows = run(args, shapes)
    rel = ratios(rows)
    pieces = {}
    if "laplacian" in args.attn:
        pieces = {s["stage"]: laplacian_pieces(args.model, s["stage"], s, args.batch, args.device) for s in shapes}
        pieces = {stage: steps for stage, steps in pieces.items() if steps is not None}
    stem, load = write_results(args, "stage_attention", load_before,
                               dict(rows=rows, ratios=rel, laplacian_pieces=pieces),
                               variant=f"_norm-{args.normalization}" if args.normalization != "auto" else "")
    table = markdown_table(
        ["stage", "tokens", "C", "heads", "attn", "mode", "median ms", "IQR ms", "forward GMACs", "GMAC/s"],
        [[r["stage"] + 1, r["tokens"], r["channels"], r["heads"], r["attn"], r["mode"], r["median_ms"], r["iqr_ms"],
          r["forward_gmacs"], r["gmacs_per_s"]] for r in rows],
    )
    table += "\n" + markdown_table(
        ["stage", "mode", "attn", "time / softmax", "forward MACs / softmax"],
        [[r["stage"] if r["stage"] == "all" else r["stage"] + 1, r["mode"], r["attn"], r["time_vs_softmax"],
          r["macs_vs_softmax"]] for r in rel],
    )
    header = report_header(f"{args.model}: first attention layer of each stage at {args.size}²", args, load,
                           f"batch {args.batch}; normalization backend {args.normalization}")
    if pieces:
        names = list(next(iter(pieces.values())))
        table += "\nLaplacian layer, inference, median ms per step (timed one after another):\n\n" + markdown_table(
            ["step", *[f"stage {s + 1}" for s in pieces]],
            [[name, *[pieces[s][name] for s in pieces]] for name in names]
            + [["sum of the steps", *[sum(v for k, v in pieces[s].items() if k != "layer") for s in pieces]]],
        )
    write_text(stem.with_suffix(".md"), header + table)
    print(header + table)
    plot(stem.with_suffix(".png"), rows, args.attn, f"{args.model} attention layers at {args.size}², batch {args.batch}")


if __name__ == "__main__":
    main()
