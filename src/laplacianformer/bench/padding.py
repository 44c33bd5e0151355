"""Padded batches against per-sequence runs: the time of one ``key_padding_mask`` call over B sequences of
different lengths, and of B calls on the unpadded sequences (docs/DESIGN.md §2.5).

    python -m laplacianformer.bench.padding                     # CPU, LaplacianAttention, 8 sequences up to 1024 tokens
    python -m laplacianformer.bench.padding --max-len 256 --batch 4 --repeats 3

Module ``LaplacianAttention(dim, heads)`` with its defaults (49 landmarks on a sequence, injective norm):
padded uses the composite normalisation (the fused path refuses masks), per-sequence runs take the fused
one. Lengths are drawn uniformly in [max_len / 2, max_len] (seeded); "padded / per-sequence" < 1 means the
padded batch is faster. Forward under no_grad; training is forward + backward of a sum. Writes
runs/bench/padding/padding_<device>.{json,md} (``--publish``: benchmarks/results/).
"""

from __future__ import annotations

import argparse

import torch

from .harness import time_call
from .options import add_timing_options, run_rows
from .report import markdown_table, report_header, write_text
from ..layers import LaplacianAttention


def run(args) -> list[dict]:
    gen = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    module = LaplacianAttention(args.dim, args.heads).to(args.device)
    rows = []
    for max_len in args.max_len:
        lengths = torch.randint(max_len // 2, max_len + 1, (args.batch,), generator=gen).tolist()
        lengths[0] = max_len
        x = torch.randn(args.batch, max_len, args.dim, generator=gen).to(args.device)
        mask = (torch.arange(max_len)[None] >= torch.tensor(lengths)[:, None]).to(args.device)
        parts = [x[b : b + 1, :n].contiguous() for b, n in enumerate(lengths)]
        for mode in ("infer", "train"):
            def padded():
                if mode == "infer":
                    with torch.no_grad():
                        return module(x, key_padding_mask=mask)
                xr = x.detach().requires_grad_(True)
                module(xr, key_padding_mask=mask).sum().backward()

            def each():
                for p in parts:
                    if mode == "infer":
                        with torch.no_grad():
                            module(p)
                    else:
                        module(p.detach().requires_grad_(True)).sum().backward()

            t_pad = time_call(padded, device=args.device, warmup=1, repeats=args.repeats)
            t_each = time_call(each, device=args.device, warmup=1, repeats=args.repeats)
            rows.append(dict(max_len=max_len, batch=args.batch, mode=mode, tokens=sum(lengths),
                             padded_tokens=args.batch * max_len, padded_ms=t_pad.median_ms, padded_iqr_ms=t_pad.iqr_ms,
                             per_sequence_ms=t_each.median_ms, per_sequence_iqr_ms=t_each.iqr_ms,
                             ratio=t_pad.median_ms / t_each.median_ms))
            print(rows[-1], flush=True)
    return rows


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--max-len", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--heads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=5)
    add_timing_options(p)
    args = p.parse_args(argv)
    rows, stem, load = run_rows(args, "padding", run, argv)
    table = markdown_table(
        ["max len", "batch", "mode", "valid tokens", "padded tokens", "padded ms", "per-sequence ms",
         "padded / per-sequence"],
        [[r["max_len"], r["batch"], r["mode"], r["tokens"], r["padded_tokens"], r["padded_ms"], r["per_sequence_ms"],
          r["ratio"]] for r in rows],
    )
    header = report_header("Padded batch vs per-sequence runs (LaplacianAttention)", args, load)
    write_text(stem.with_suffix(".md"), header + table)
    print(header + table)


if __name__ == "__main__":
    main()
