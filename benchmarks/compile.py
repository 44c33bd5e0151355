"""``python -m benchmarks.compile`` from a checkout runs ``laplacianformer.bench.compile``
(``laplacianformer bench compile``), where the benchmark lives."""

from laplacianformer.bench.compile import main

if __name__ == "__main__":
    main()
