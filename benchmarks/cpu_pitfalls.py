"""``python -m benchmarks.cpu_pitfalls`` in a checkout: the benchmark is ``laplacianformer.bench.cpu_pitfalls`` (``laplacianformer bench cpu_pitfalls``)."""

from laplacianformer.bench.cpu_pitfalls import main

if __name__ == "__main__":
    main()
