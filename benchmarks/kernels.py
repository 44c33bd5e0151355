"""``python -m benchmarks.kernels`` from a checkout runs ``laplacianformer.bench.kernels``
(``laplacianformer bench kernels``), where the benchmark lives."""

from laplacianformer.bench.kernels import main

if __name__ == "__main__":
    main()
