"""``python -m benchmarks.normalization`` from a checkout runs ``laplacianformer.bench.normalization``
(``laplacianformer bench normalization``), where the benchmark lives."""

from laplacianformer.bench.normalization import main

if __name__ == "__main__":
    main()
