"""Issue 29's GPU target table: the prepared GPU run's results (``benchmarks/gpu_check.sh``) against the targets
and against an earlier run, read from the benchmarks' JSON files.

    python -m benchmarks.gpu_targets --measured OUTDIR                  # vs the first H200 run
    python -m benchmarks.gpu_targets --measured OUTDIR --previous DIR --out OUTDIR/gpu_targets

Repository only (not in the wheel): run from the checkout's root.

Every quantity has one extractor, which reads the JSON file(s) one benchmark writes into a directory (the file
names ``benchmarks/gpu_check.sh`` gives them) and returns the number judged against the target and its text; a
missing file or row gives "not measured", never an error. The same extractors read ``--measured`` and
``--previous`` (default ``benchmarks/results/gpu_check_h200`` of the current directory, the first H200 run), so
the "previous" column is computed from the committed files. Only rows of the Tiny backbone at batch 8 count
(the settings the targets are stated for). Ratios are Laplacian / spatial-reduction softmax Tiny in the same
run; "fp32" rows run in float32, "bf16-autocast" rows under ``torch.autocast(dtype=bfloat16)``. Where the first
run had no benchmark for a quantity an extractor falls back to the nearest measurement it made (the Newton–Schulz
time from the roofline rows, the kernel matrix from the kernel benchmark at d = 32), named in the text.

Writes ``gpu_targets.{md,json,png}`` (runs/bench/gpu_targets/ unless ``--out``; the PNG: measured / target and
previous / target per row, log scale, the target at 1). docs/KERNELS.md "The prepared GPU run".
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.bench.report import markdown_table, write_json, write_text

PREVIOUS = Path("benchmarks") / "results" / "gpu_check_h200"
MODEL, BATCH, SIZE = "laplacianformer_tiny", 8, 512
FP32, BF16 = "fp32", "bf16-autocast"
CROSSOVER_TARGET = 768
NS_M, NS_COND = 49, 1e3
C_GROUP_TOKENS, C_DIM, C_M = 131_072, 64, 49
OPERATOR_N = 65_536
GPU_CHECK_FILES = (
    "gpu_overhead_cuda.json", "gpu_overhead_cuda_bf16.json", "gpu_overhead_cuda_compiled.json",
    "model_throughput_cuda.json", "model_throughput_cuda_bf16.json", "stage_attention_cuda.json",
    "gpu_micro_cuda.json", "attention_scaling_cuda.json",
)
"""The files ``benchmarks/gpu_check.sh`` writes for the table (a test holds its steps to them). The first run's
other files are read as fallbacks: model_throughput_cuda_highres.json, roofline_measured.json, kernels_cuda.json."""


@dataclass(frozen=True)
class Extracted:
    """One quantity read from one directory: ``value`` is judged against the target (None: not judged), ``text``
    is shown, ``source`` names the file(s) read."""

    value: float | None
    text: str
    source: str


@dataclass(frozen=True)
class Target:
    """One row of the table: met when the extracted value is <= ``limit`` (no limit: shown, not judged)."""

    quantity: str
    precision: str
    target: str
    limit: float | None
    extract: Callable[[Path], Extracted | None]


# --- reading the files ------------------------------------------------------------------------------------

def _load(directory: Path, name: str):
    """The parsed JSON file ``directory/name``, or None when it is missing or not JSON."""
    try:
        return json.loads((directory / name).read_text())
    except (OSError, ValueError):
        return None


def _results(payload) -> tuple[object, dict]:
    """(results, settings) of a file written by ``report.write_json`` (a bare payload: itself, no settings)."""
    if isinstance(payload, dict) and "results" in payload:
        return payload["results"], payload.get("settings") or {}
    return payload, {}


def _ratio_text(lap: float, soft: float, unit: str = "ms") -> str:
    return f"{lap / soft:.2f}× ({lap:.3g} / {soft:.3g} {unit})"


def _side(size: float) -> str:
    return f"{size:g}²"


# --- Tiny 512² inference: eager, CUDA graph, torch.compile (bench/gpu_overhead.py) ---------------------------

def _overhead_files(precision: str) -> list[str]:
    """fp32: the run without torch.compile first, then the one with it (which also times eager and the graph)."""
    if precision == BF16:
        return ["gpu_overhead_cuda_bf16.json"]
    return ["gpu_overhead_cuda.json", "gpu_overhead_cuda_compiled.json"]


def tiny512_inference(field: str, precision: str) -> Callable[[Path], Extracted | None]:
    """Laplacian / SR-softmax ratio of ``field`` (eager_ms, graph_ms, compiled_ms) of the Tiny backbone at 512²,
    batch 8, from gpu_overhead's rows (the first file that has both)."""

    def extract(directory: Path) -> Extracted | None:
        for name in _overhead_files(precision):
            rows, settings = _results(_load(directory, name))
            if not isinstance(rows, list) or (settings.get("model"), settings.get("batch"), settings.get("size")) \
                    != (MODEL, BATCH, SIZE):
                continue
            by = {r.get("attn"): r for r in rows if r.get("precision", FP32) == precision}
            lap, soft = (by.get(a, {}).get(field) for a in ("laplacian", "softmax"))
            if lap and soft:
                return Extracted(lap / soft, _ratio_text(lap, soft), name)
        return None

    return extract


# --- Tiny eager inference and training step at one size; the crossover (bench/model_throughput.py) -----------

def _throughput_rows(directory: Path, precision: str) -> tuple[dict, list[str]]:
    """{(size, mode, attn): median ms} of the Tiny backbone at batch 8 in ``precision``, and the files they came
    from (fp32: model_throughput_cuda.json, then the first run's model_throughput_cuda_highres.json)."""
    names = (["model_throughput_cuda_bf16.json"] if precision == BF16
             else ["model_throughput_cuda.json", "model_throughput_cuda_highres.json"])
    times: dict = {}
    read = []
    for name in names:
        results, _ = _results(_load(directory, name))
        rows = results.get("rows") if isinstance(results, dict) else None
        rows = [r for r in rows if isinstance(r, dict) and (r.get("model"), r.get("batch"), r.get("precision", FP32))
                == (MODEL, BATCH, precision)] if isinstance(rows, list) else []
        if rows:
            read.append(name)
        for r in rows:
            times.setdefault((r.get("size"), r.get("mode"), r.get("attn")), r.get("median_ms"))
    return times, read


def tiny_ratio(size: int, mode: str, precision: str) -> Callable[[Path], Extracted | None]:
    """Laplacian / SR-softmax time of the Tiny backbone at ``size``², batch 8, ``mode`` (infer: eager
    inference; train: forward + loss + backward), from model_throughput's rows."""

    def extract(directory: Path) -> Extracted | None:
        times, read = _throughput_rows(directory, precision)
        lap, soft = times.get((size, mode, "laplacian")), times.get((size, mode, "softmax"))
        return Extracted(lap / soft, _ratio_text(lap, soft), " + ".join(read)) if lap and soft else None

    return extract


def crossover(mode: str, precision: str) -> Callable[[Path], Extracted | None]:
    """The smallest measured image side at which the Laplacian Tiny is faster than the SR-softmax Tiny (``mode``,
    batch 8). Judged value: that side; infinity when it is slower at every measured side and one of them is at
    least the target side; None (not judged) when it is slower at every side and all are smaller than that."""

    def extract(directory: Path) -> Extracted | None:
        times, read = _throughput_rows(directory, precision)
        sides = sorted(s for (s, m, a) in times if m == mode and a == "laplacian" and times.get((s, m, "softmax")))
        if not sides:
            return None
        faster = [s for s in sides if times[(s, mode, "laplacian")] < times[(s, mode, "softmax")]]
        source = " + ".join(read)
        if faster:
            below = [s for s in sides if s < faster[0]]
            text = _side(faster[0]) + (f" (slower at {_side(below[-1])})" if below else " (the smallest measured)")
            return Extracted(float(faster[0]), text, source)
        text = f"none up to {_side(sides[-1])} (slower at every measured side)"
        return Extracted(math.inf if sides[-1] >= CROSSOVER_TARGET else None, text, source)

    return extract


# --- one attention layer (bench/stage_attention.py) ---------------------------------------------------------

def layer_inference(directory: Path) -> Extracted | None:
    """The slowest stage's first Laplacian attention layer, eager inference, Tiny at 512², batch 8 (range over
    the stages shown)."""
    name = "stage_attention_cuda.json"
    results, settings = _results(_load(directory, name))
    if not isinstance(results, dict) or (settings.get("model"), settings.get("batch"), settings.get("size")) \
            != (MODEL, BATCH, SIZE):
        return None
    ms = [r["median_ms"] for r in results.get("rows", []) if r.get("attn") == "laplacian" and r.get("mode") == "infer"]
    if not ms:
        return None
    return Extracted(max(ms), f"{min(ms):.3g}–{max(ms):.3g} ms ({len(ms)} stages)", name)


# --- Newton–Schulz and one kernel matrix (benchmarks/gpu_micro.py; the first run: roofline, kernels) --------------

def _micro_rows(directory: Path, case: str) -> list[dict]:
    rows, _ = _results(_load(directory, "gpu_micro_cuda.json"))
    return [r for r in rows if isinstance(r, dict) and r.get("case") == case] if isinstance(rows, list) else []


def ns_time(matrices: int) -> Callable[[Path], Extracted | None]:
    """Microseconds of the Newton–Schulz solve of ``matrices`` 49×49 matrices, 20 iterations (gpu_micro; the
    first run: the roofline's ns_fwd rows with that many matrices, the slowest of them judged)."""

    def extract(directory: Path) -> Extracted | None:
        for r in _micro_rows(directory, "ns"):
            if (r.get("matrices"), r.get("m"), r.get("iters")) == (matrices, NS_M, 20):
                return Extracted(r["median_us"], f"{r['median_us']:.4g} µs", "gpu_micro_cuda.json")
        name = "roofline_measured.json"
        results, _ = _results(_load(directory, name))
        rows = results.get("rows") if isinstance(results, dict) else None
        us = [r["measured_us"] for r in rows or [] if r.get("kernel") == "ns_fwd"
              and (r.get("batch_heads"), r.get("m")) == (matrices, NS_M)]
        if not us:
            return None
        span = f"{min(us):.4g}–{max(us):.4g}" if len(us) > 1 else f"{us[0]:.4g}"
        return Extracted(max(us), f"{span} µs (roofline ns_fwd)", name)

    return extract


def ns_accuracy(directory: Path) -> Extracted | None:
    """The largest relative difference of a Newton–Schulz result (float32, 49×49, 20 iterations, condition
    <= 1e3) from the same iteration in float64, over gpu_micro's batches."""
    rows = [r for r in _micro_rows(directory, "ns")
            if r.get("m") == NS_M and r.get("iters") == 20 and r.get("max_cond", math.inf) <= NS_COND]
    if not rows:
        return None
    err = max(r["max_rel_err_vs_float64"] for r in rows)
    return Extracted(err, f"{err:.2e} ({'/'.join(str(r['matrices']) for r in rows)} matrices)", "gpu_micro_cuda.json")


def c_matrix(directory: Path) -> Extracted | None:
    """Microseconds of one kernel matrix C = k(X, L) at G·N = 131,072, d 64, m 49 (gpu_micro; the first run:
    the kernel benchmark's Triton forward at B·H·N = 131,072, d 32, wall clock)."""
    for r in _micro_rows(directory, "kernel"):
        if (r.get("group_tokens"), r.get("d"), r.get("m")) == (C_GROUP_TOKENS, C_DIM, C_M):
            return Extracted(r["median_us"], f"{r['median_us']:.4g} µs", "gpu_micro_cuda.json")
    name = "kernels_cuda.json"
    rows, _ = _results(_load(directory, name))
    for r in rows if isinstance(rows, list) else []:
        if (r.get("case"), r.get("backend"), r.get("mode"), r.get("device")) == ("kernel", "triton", "fwd", "cuda") \
                and 2 * r.get("n", 0) == C_GROUP_TOKENS:
            us = r["median_ms"] * 1e3
            return Extracted(us, f"{us:.4g} µs (kernels bench: B·H 2 × N {r['n']}, d 32)", name)
    return None


# --- the operator against SOFT (bench/attention_scaling.py) -------------------------------------------------

def operator_vs_soft(directory: Path) -> Extracted | None:
    """Laplacian operator / SOFT forward+backward time at N = 64k (B 1, H 2, d 32), from attention_scaling."""
    name = "attention_scaling_cuda.json"
    results, _ = _results(_load(directory, name))
    records = results.get("records") if isinstance(results, dict) else None
    ms = {r.get("method"): (r.get("time") or {}).get("median_ms") for r in records or []
          if r.get("n") == OPERATOR_N and r.get("status") == "ok"}
    lap, soft = ms.get("laplacian"), ms.get("soft")
    if not (lap and soft):
        return None
    return Extracted(lap / soft, f"{lap:.3g} ms (SOFT {soft:.3g} ms): {lap / soft:.2f}×", name)


TARGETS: tuple[Target, ...] = (
    *(t for p in (FP32, BF16) for t in (
        Target("Tiny 512² inference, eager (Laplacian / SR-softmax)", p, "≤ 1.25×", 1.25,
               tiny512_inference("eager_ms", p)),
        Target("Tiny 512² inference, CUDA graph (Laplacian / SR-softmax)", p, "≤ 1.1×", 1.1,
               tiny512_inference("graph_ms", p)),
    )),
    Target("Tiny 512² inference, torch.compile (Laplacian / SR-softmax)", FP32, "(no target)", None,
           tiny512_inference("compiled_ms", FP32)),
    *(Target("Tiny 224² inference, eager (Laplacian / SR-softmax)", p, "≤ 1.5×", 1.5, tiny_ratio(224, "infer", p))
      for p in (FP32, BF16)),
    *(Target("Tiny 512² training step (Laplacian / SR-softmax)", p, "≤ 1.3×", 1.3, tiny_ratio(512, "train", p))
      for p in (FP32, BF16)),
    *(Target(f"crossover, {label} (smallest side where Laplacian is faster)", p, f"≤ {CROSSOVER_TARGET}²",
             CROSSOVER_TARGET, crossover(mode, p))
      for mode, label in (("infer", "inference"), ("train", "training step")) for p in (FP32, BF16)),
    Target("one attention layer, eager inference (slowest stage, 512²)", FP32, "≤ 0.5 ms", 0.5, layer_inference),
    Target("Newton–Schulz, 64 matrices 49×49, 20 iterations", FP32, "≤ 50 µs", 50.0, ns_time(64)),
    Target("Newton–Schulz, 132 matrices 49×49 (flat up to 132)", FP32, "≤ 50 µs", 50.0, ns_time(132)),
    Target("Newton–Schulz vs float64, cond ≤ 1e3 (max rel. diff.)", FP32, "≤ 1e-5", 1e-5, ns_accuracy),
    Target("one C matrix (G·N = 131,072, d 64, m 49)", FP32, "≤ 60 µs", 60.0, c_matrix),
    Target("operator fwd+bwd, N = 64k, B1 H2 d32 (Laplacian / SOFT)", FP32, "≤ SOFT's time", 1.0, operator_vs_soft),
)
"""The table's rows, in the issue's order, each with its target and extractor."""


def judge(target: Target, found: Extracted | None) -> str:
    """"yes" / "no" / "not measured" (no value) / "no target"."""
    if found is None or found.value is None:
        return "not measured"
    if target.limit is None:
        return "no target"
    return "yes" if found.value <= target.limit else "no"


def _finite(x: float | None) -> float | None:
    return x if x is not None and math.isfinite(x) else None


def table_rows(measured: Path, previous: Path | None) -> list[dict]:
    """One dict per target: quantity, precision, previous, measured, target, met, their values and sources."""
    rows = []
    for t in TARGETS:
        now = t.extract(measured)
        before = t.extract(previous) if previous is not None else None
        rows.append(dict(
            quantity=t.quantity, precision=t.precision, target=t.target, limit=t.limit,
            previous=before.text if before else "not measured", measured=now.text if now else "not measured",
            met=judge(t, now), previous_met=judge(t, before),
            previous_value=_finite(before.value) if before else None,
            measured_value=_finite(now.value) if now else None,
            previous_source=before.source if before else None, measured_source=now.source if now else None,
        ))
    return rows


def markdown(rows: list[dict], measured: Path, previous: Path | None) -> str:
    head = (f"# Issue 29's GPU targets\n\nMeasured: `{measured}`; previous: `{previous}`. Tiny backbone, batch 8; "
            "ratios are Laplacian / SR-softmax Tiny in the same run (docs/KERNELS.md \"The prepared GPU run\").\n\n")
    met = sum(r["met"] == "yes" for r in rows)
    judged = sum(r["met"] in ("yes", "no") for r in rows)
    body = markdown_table(["quantity", "precision", "previous", "measured", "target", "met"],
                          [[r["quantity"], r["precision"], r["previous"], r["measured"], r["target"], r["met"]]
                           for r in rows])
    sources = sorted({s for r in rows for s in (r["measured_source"],) if s})
    return head + body + f"\n{met} of {judged} measured targets met. Files read: {', '.join(sources) or 'none'}.\n"


def plot(path: Path, rows: list[dict]) -> Path:
    """Horizontal bars of previous / target and measured / target (log scale), a line at 1 (the target)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if r["limit"]]
    fig, ax = plt.subplots(figsize=(10, 0.45 * len(shown) + 1.5))
    ys = range(len(shown))
    ratios = []
    for offset, key, style in ((0.2, "previous_value", dict(color="0.7", label="previous")),
                               (-0.2, "measured_value", dict(color="C0", label="measured"))):
        vals = [(y, r[key] / r["limit"]) for y, r in zip(ys, shown) if r[key] is not None and r[key] > 0]
        ratios += [v for _, v in vals]
        if vals:
            ax.barh([y + offset for y, _ in vals], [v for _, v in vals], height=0.38, **style)
    ax.set_xscale("log")
    ax.set_xlim(min([0.5, *ratios]) / 1.5, max([2.0, *ratios]) * 1.5)
    for y, r in zip(ys, shown):
        if r["measured_value"] is None:
            ax.annotate(r["met"], (1.0, y - 0.2), fontsize=7, va="center", color="C3")
    ax.axvline(1.0, color="k", linestyle="--", linewidth=1, label="target")
    ax.set_yticks(list(ys))
    ax.set_yticklabels([f"{r['quantity']} [{r['precision']}]" for r in shown], fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("value / target (≤ 1: met)")
    ax.grid(True, axis="x", which="both", alpha=0.3)
    ax.legend(fontsize=8, loc="lower right")
    ax.set_title("Issue 29's GPU targets")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--measured", required=True, type=Path, metavar="DIR",
                   help="the directory of JSON files a gpu_check run wrote")
    p.add_argument("--previous", default=PREVIOUS, type=Path, metavar="DIR",
                   help=f"an earlier run's directory, read by the same extractors (default ./{PREVIOUS})")
    add_output_options(p)
    args = p.parse_args(argv)
    for flag, directory in (("--measured", args.measured), ("--previous", args.previous)):
        if not directory.is_dir():
            p.error(f"{flag}: {directory}: no such directory")
    rows = table_rows(args.measured, args.previous)
    stem = output_stem(args, "gpu_targets", "gpu_targets")
    text = markdown(rows, args.measured, args.previous)
    print(text)
    write_json(stem.with_suffix(".json"), rows, settings={k: str(v) for k, v in vars(args).items()})
    write_text(stem.with_suffix(".md"), text)
    plot(stem.with_suffix(".png"), rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
