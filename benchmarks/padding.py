"""``python -m benchmarks.padding`` in a checkout: the benchmark is ``laplacianformer.bench.padding`` (``laplacianformer bench padding``)."""

from laplacianformer.bench.padding import main

if __name__ == "__main__":
    main()
