"""``python -m benchmarks.normalization`` in a checkout: the benchmark is ``laplacianformer.bench.normalization`` (``laplacianformer bench normalization``)."""

from laplacianformer.bench.normalization import main

if __name__ == "__main__":
    main()
