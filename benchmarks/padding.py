"""``python -m benchmarks.padding`` from a checkout runs ``laplacianformer.bench.padding``
(``laplacianformer bench padding``), where the benchmark lives."""

from laplacianformer.bench.padding import main

if __name__ == "__main__":
    main()
