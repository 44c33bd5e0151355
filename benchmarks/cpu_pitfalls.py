"""Two CPU effects that move the timings of this project, measured: fresh-page faults and subnormal floats.

    python -m benchmarks.cpu_pitfalls

Repository only (not in the wheel): run from the checkout's root.

1. Fresh pages: filling a 4 MiB float32 tensor that lives in newly mapped memory (each 4 KiB page faults on
   first touch) against filling one already touched. With glibc's defaults freed large tensors are unmapped,
   so later ones pay this (``laplacianformer.bench.allocator``; ``--retain-heap`` of the timing scripts avoids it).
2. Subnormals: a (4096×49) by (49×64) product, one thread, with ordinary entries and with every other entry of
   the left factor subnormal (1e-39); then ``laplacian_attention`` (2 heads, 64×64 grid, d = 64, 7×7
   landmarks) with q and k scaled by s for all tokens or for a fraction of them. Far from the landmarks the
   similarities are tiny, the injective covariances (their squares) fall into float32's subnormal range, and
   x86 arithmetic on subnormals is slow unless flush-to-zero is on. The last rows repeat the all-token cases
   with ``torch.set_flush_denormal(True)``, which sets the calling thread only.
Writes runs/bench/cpu_pitfalls/cpu_pitfalls.{json,md,png}. (``--publish``: benchmarks/results/)
"""

from __future__ import annotations

import argparse
import mmap
import time

import torch

from laplacianformer.bench.harness import time_call
from laplacianformer.bench.output import add_output_options, output_stem
from laplacianformer.bench.report import markdown_table, write_json, write_text
from laplacianformer.ops.attention import laplacian_attention

PAGE = 4096


def fresh_page_fill(mib: int = 4, repeats: int = 20) -> dict:
    """Median ms to fill ``mib`` MiB of float32 in freshly mapped memory and in memory already touched."""
    nbytes = mib * 2**20
    fresh = []
    for _ in range(repeats):
        with mmap.mmap(-1, nbytes) as buf:
            t = torch.frombuffer(buf, dtype=torch.float32)
            t0 = time.perf_counter()
            t.fill_(1.0)
            fresh.append((time.perf_counter() - t0) * 1e3)
            del t
    touched = torch.ones(nbytes // 4)
    reused = time_call(lambda: touched.fill_(1.0), warmup=2, repeats=repeats).median_ms
    fresh_ms = sorted(fresh)[len(fresh) // 2]
    return dict(mib=mib, pages=nbytes // PAGE, fresh_ms=fresh_ms, touched_ms=reused,
                us_per_page=(fresh_ms - reused) * 1e3 / (nbytes // PAGE))


def subnormal_product(repeats: int = 30) -> dict:
    """Median ms of a (4096, 49) @ (49, 64) product on one thread, ordinary and half-subnormal left factor."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        a = torch.rand(4096, 49)
        b = torch.randn(49, 64)
        sub = a.clone()
        sub[:, ::2] = 1e-39
        assert bool(((sub != 0) & (sub.abs() < torch.finfo(torch.float32).tiny)).any())
        normal = time_call(lambda: a @ b, warmup=3, repeats=repeats).median_ms
        slow = time_call(lambda: sub @ b, warmup=3, repeats=repeats).median_ms
    finally:
        torch.set_num_threads(threads)
    return dict(normal_ms=normal, subnormal_ms=slow, slowdown=slow / normal)


def attention_at_scale(scale: float, fraction: float, repeats: int, seed: int = 0) -> float:
    """Median ms of ``laplacian_attention`` with q and k of ``fraction`` of the tokens multiplied by ``scale``."""
    torch.manual_seed(seed)
    n = 64 * 64
    q, k, v = (torch.randn(1, 2, n, 64) for _ in range(3))
    idx = torch.randperm(n)[: int(round(fraction * n))]
    q[:, :, idx] *= scale
    k[:, :, idx] *= scale
    with torch.no_grad():
        return time_call(lambda: laplacian_attention(q, k, v, hw=(64, 64)), warmup=1, repeats=repeats).median_ms


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5, help="timed calls per attention case")
    add_output_options(p)
    args = p.parse_args(argv)
    stem = output_stem(args, "cpu_pitfalls", "cpu_pitfalls")
    pages = fresh_page_fill()
    product = subnormal_product()
    cases = [(1.0, 1.0, False), (20.0, 1.0, False), (40.0, 1.0, False), (40.0, 0.05, False), (40.0, 0.2, False),
             (20.0, 1.0, True), (40.0, 1.0, True)]
    attention = []
    for scale, fraction, flush in cases:
        supported = torch.set_flush_denormal(flush)  # False where the CPU has no flush-to-zero
        try:
            ms = attention_at_scale(scale, fraction, args.repeats)
        finally:
            torch.set_flush_denormal(False)
        attention.append(dict(scale=scale, fraction=fraction, flush_denormal=flush and supported, ms=ms))
    write_json(stem.with_suffix(".json"), dict(fresh_pages=pages, subnormal_product=product, attention=attention),
               settings=vars(args))
    text = "# CPU pitfalls (2 torch threads unless noted)\n\n" + markdown_table(
        ["fresh pages", "MiB", "pages", "fill fresh ms", "fill touched ms", "us per page"],
        [["4 KiB pages", pages["mib"], pages["pages"], pages["fresh_ms"], pages["touched_ms"], pages["us_per_page"]]],
    )
    text += "\n" + markdown_table(
        ["(4096x49) @ (49x64), 1 thread", "ordinary ms", "half subnormal ms", "slowdown"],
        [["product", product["normal_ms"], product["subnormal_ms"], product["slowdown"]]],
    )
    text += "\n" + markdown_table(
        ["q, k scale", "fraction of tokens", "set_flush_denormal", "laplacian_attention ms"],
        [[r["scale"], r["fraction"], r["flush_denormal"], r["ms"]] for r in attention],
    )
    write_text(stem.with_suffix(".md"), text)
    print(text)

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    labels = [f"x{r['scale']:g}, {r['fraction']:.0%}" + (", flush" if r["flush_denormal"] else "") for r in attention]
    ax.bar(range(len(attention)), [r["ms"] for r in attention], color="C0")
    ax.set_xticks(range(len(attention)))
    ax.set_xticklabels(labels, rotation=20, fontsize=8)
    ax.set_ylabel("laplacian_attention ms")
    ax.set_yscale("log")
    ax.set_title("q, k scaled away from the landmarks: subnormal arithmetic on the CPU")
    fig.tight_layout()
    fig.savefig(stem.with_suffix(".png"), dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
