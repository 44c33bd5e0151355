"""``python -m benchmarks.roofline`` from a checkout runs ``laplacianformer.bench.roofline``
(``laplacianformer bench roofline``), where the benchmark lives."""

from laplacianformer.bench.roofline import main

if __name__ == "__main__":
    main()
