"""``python -m benchmarks.startup`` from a checkout runs ``laplacianformer.bench.startup``
(``laplacianformer bench startup``), where the benchmark lives."""

from laplacianformer.bench.startup import main

if __name__ == "__main__":
    main()
