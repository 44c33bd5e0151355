"""The demo's report: the fields derived from the measurements (cost rows, ratios to softmax, crossovers,
growth exponents, the idle-machine estimate) and results.md (what ran, the accuracy and cost tables)."""

from __future__ import annotations

import json
from pathlib import Path

from ..bench.model_cost import cost_table, crossover, growth_exponents
from .scheduler import idle_wall_estimate


def cost_rows(cells: list[dict]) -> list[dict]:
    """The cost cells merged per (size, attention): forward and train-step ms, CPU ms and peak MiB per image."""
    rows: dict[tuple, dict] = {}
    for c in cells:
        row = rows.setdefault((c["size"], c["attn"]), dict(size=c["size"], attn=c["attn"],
                                                            stage1_tokens=c.get("tokens_stage1")))
        prefix = "forward" if c["mode"] == "infer" else "train_step"
        if c.get("skipped"):
            row[f"{prefix}_skipped"] = c["skipped"]
            continue
        row.update({f"{prefix}_ms": c["ms_per_image"], f"{prefix}_cpu_ms": c["cpu_ms_per_image"],
                    f"{prefix}_peak_mib": c["peak_heap_mib"]})
        if c["mode"] == "train":
            row["activations_mib"] = c["activations_mib"]
        row["stage1_tokens"] = row.get("stage1_tokens") or c.get("tokens_stage1")
    return list(rows.values())


def accuracy_table(rows: list[dict]) -> str:
    head = ("| attention | top-1 (%) | top-5 (%) | test loss | params | MACs/image | train time (s) | CPU time (s) "
            "| train images/s | peak RSS (MiB) |\n|---|---|---|---|---|---|---|---|---|---|\n")
    lines = []
    for r in rows:
        macs = f"{r['macs'] / 1e6:.1f}M" if r.get("macs") else "n/a"
        lines.append(f"| {r['attn']} | {100 * r['top1']:.2f} | {100 * r['top5']:.2f} | {r['loss']:.3f} "
                     f"| {r['params'] / 1e6:.3f}M | {macs} | {r['train_time_s']:.0f} | {r['cpu_time_s']:.0f} "
                     f"| {r['images_per_s']:.0f} | {r['peak_memory_mb']:.0f} |")
    return head + "\n".join(lines) + "\n"


def key_ratios(cells: list[dict], attns: list[str]) -> dict:
    """At the largest size every attention measured: each one's time and peak memory over softmax's, and the
    crossover sizes (smallest measured size from which it is no slower / no larger than softmax; memory within
    1 % counts as equal)."""
    out: dict = {}
    if "softmax" not in attns:
        return out
    ok = [c for c in cells if not c.get("skipped")]
    for attn in attns:
        if attn == "softmax":
            continue
        entry = {}
        for mode in ("infer", "train"):
            both = {c["size"] for c in ok if c["mode"] == mode and c["attn"] == attn} & \
                   {c["size"] for c in ok if c["mode"] == mode and c["attn"] == "softmax"}
            if not both:
                continue
            size = max(both)
            a = next(c for c in ok if (c["size"], c["mode"], c["attn"]) == (size, mode, attn))
            b = next(c for c in ok if (c["size"], c["mode"], c["attn"]) == (size, mode, "softmax"))
            def div(key):
                return a[key] / b[key] if a.get(key) and b.get(key) else None

            entry[mode] = dict(
                size=size, time=div("ms_per_image"), cpu_time=div("cpu_ms_per_image"), peak_heap=div("peak_heap_mib"),
                activations=div("activations_mib"),
                crossover_time=crossover(cells, attn, mode=mode, field="ms_per_image"),
                crossover_cpu_time=crossover(cells, attn, mode=mode, field="cpu_ms_per_image"),
                crossover_peak_heap=crossover(cells, attn, mode=mode, field="peak_heap_mib", tol=0.01),
            )
        out[attn] = entry
    return out


def _ratio_lines(ratios: dict, sizes: list[int]) -> str:
    names = {"infer": "forward", "train": "training step"}
    span = f"{min(sizes)}–{max(sizes)}²" if sizes else "the measured sizes"
    lines = []
    for attn, entry in ratios.items():
        for mode, r in entry.items():
            def x(v):
                return f"{v:.2f}×" if v else "n/a"

            def cross(key):
                return f"from {r[key]}² on" if r[key] else f"never in {span}"

            act = f", activations {x(r.get('activations'))}" if r.get("activations") else ""
            lines.append(f"- {attn} / softmax-SR, {names[mode]} at {r['size']}²: CPU time {x(r['cpu_time'])}, wall "
                         f"{x(r['time'])}, peak heap {x(r['peak_heap'])}{act}. "
                         f"No slower: {cross('crossover_cpu_time')} "
                         f"(CPU time), {cross('crossover_time')} (wall); no more memory: "
                         f"{cross('crossover_peak_heap')}.")
    return "\n".join(lines) + "\n"


def derive(result: dict) -> dict:
    """Fills the fields computed from the measurements (cost ratios, crossovers, growth exponents, idle-machine
    estimate) into ``result``; used by ``run_demo`` and by ``rerender`` on a saved results.json."""
    s = result["settings"]
    cpu = [r["cpu_time_s"] for r in result["rows"]]
    if result.get("cost"):
        c = result["cost"]
        c["rows"] = cost_rows(c["cells"])
        c["key_ratios"] = key_ratios(c["cells"], [r["attn"] for r in result["rows"]])
        c["growth_exponents_cpu"] = growth_exponents(c["cells"], "cpu_ms_per_image")
        c["growth_exponents_peak_heap"] = growth_exponents(c["cells"], "peak_heap_mib")
        cpu.append(c["cpu_s"])
    s["idle_wall_estimate_s"] = idle_wall_estimate(cpu, s["jobs"])
    return result


def rerender(out: str | Path) -> str:
    """Recomputes the derived fields of ``out``/results.json and rewrites it and results.md (no rerun)."""
    out = Path(out)
    result = derive(json.loads((out / "results.json").read_text()))
    (out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = results_markdown(result)
    (out / "results.md").write_text(md)
    return md


def results_markdown(result: dict) -> str:
    """results.md: what ran, the accuracy table, the cost table and its key ratios."""
    s, rows, cost = result["settings"], result["rows"], result["cost"]
    p, r = s["protocol"], s["recipe"]
    n_train = rows[0].get("steps", 0) * r["batch_size"] if rows else 0
    load = s.get("load_average_mean_during")
    load_note = (f"Mean 1-minute load average during the run: {load:.1f} on {s['cpu_count']} CPUs"
                 + (" (a busy machine: wall times are longer than on an idle one; CPU seconds are the steadier "
                    "measure)." if load and load > 1.5 * s["cpu_count"] else "."))
    keys = p.get("softmax_queries_keys")
    keys_note = ("; softmax-SR (PVTv2 reductions 8, 4, 2, 1) attends, per layer, queries → keys: "
                 + ", ".join(f"{q} → {k}" for q, k in keys) if keys else "")
    text = [
        f"# Demo results{' (quick smoke test: not results)' if s['quick'] else ''}\n",
        f"`laplacianformer demo` on {s['date_utc']}: {s['model']}, {r['data']} at {p['img_size']} px, stem stride "
        f"{p['stem_stride']}: stage 1 is {p['stage1_grid'][0]}×{p['stage1_grid'][1]} = {p['stage1_tokens']} tokens "
        f"for {p['landmarks']} landmarks ({p['tokens_per_landmark']:.0f} per landmark, the protocol asks "
        f"≥ {p['min_tokens_per_landmark']}), so the Nyström path is exercised{keys_note}. "
        f"Recipe: {r['epochs']} epoch(s) over {r.get('train_subset') or 'all'} training images "
        f"(~{n_train} seen), batch {r['batch_size']}, AdamW lr {r['lr']:g}, warm-up {r['warmup_epochs']:g} epoch, "
        f"weight decay {r['weight_decay']:g}, drop path {r['drop_path']:g}, label smoothing {r['label_smoothing']:g}, "
        f"crop {'on' if r['random_crop'] else 'off'}, flip {'on' if r['hflip'] else 'off'}, seed {r['seed']}; "
        f"test on {rows[0].get('eval_n') if rows else '?'} images. {s['jobs']} job(s) at a time, {s['threads']} "
        f"thread(s) each, {s['cpu']} ({s['cpu_count']} CPUs), torch {s['versions']['torch']}.\n",
        f"Total wall time {s['total_wall_time_s']:.0f} s; CPU time of all processes {s['total_cpu_time_s']:.0f} s. "
        f"{load_note} On {s['jobs']} idle cores the jobs' CPU seconds would take about "
        f"{s['idle_wall_estimate_s']:.0f} s of wall time (longest first, each on the least-loaded core; an "
        f"estimate, not a measurement).\n",
        "## Accuracy at this budget\n",
        accuracy_table(rows),
        "Train time: the training loop's own clock; CPU time: the whole subprocess (start-up, data, training, "
        "evaluation); peak RSS: the subprocess's resident high-water mark.\n",
    ]
    if cost:
        cs = cost["settings"]
        text += [
            "## Cost per image against resolution\n",
            f"{cs['model']} with stem stride {cs['model_kwargs'].get('stem_stride', 4)}, batch 1, {cs['threads']} "
            f"thread(s), attentions round-robin ({cs['repeats']} rounds, median); measured beside the last training "
            f"on the other core. Peak MiB: the C heap in use (mallinfo2 sampled after every aten op) above the level "
            f"before the call; activations: the storages autograd saves for the backward. The training step is "
            f"forward + loss + backward (no optimiser step). Cost panel: {cs['wall_s']:.0f} s wall, "
            f"{cs['cpu_s']:.0f} CPU-s.\n",
            cost_table(cost["cells"]),
            "Relative to softmax-SR at the largest measured size:\n",
            _ratio_lines(cost["key_ratios"], cost["settings"]["sizes"]) if cost["key_ratios"] else "(no softmax row)\n",
            "Growth of CPU time per image with the stage-1 tokens (least-squares exponent over the measured sizes; "
            "1 is linear, 2 quadratic): " + "; ".join(
                f"{a} forward {e.get('infer', float('nan')):.2f}, training step {e.get('train', float('nan')):.2f}"
                for a, e in cost["growth_exponents_cpu"].items()) + ".\n",
        ]
    return "\n".join(text)
