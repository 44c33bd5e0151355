"""``python -m benchmarks.compile`` in a checkout: the benchmark is ``laplacianformer.bench.compile`` (``laplacianformer bench compile``)."""

from laplacianformer.bench.compile import main

if __name__ == "__main__":
    main()
