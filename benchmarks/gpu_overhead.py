"""``python -m benchmarks.gpu_overhead`` from a checkout runs ``laplacianformer.bench.gpu_overhead``
(``laplacianformer bench gpu_overhead``), where the benchmark lives."""

from laplacianformer.bench.gpu_overhead import main

if __name__ == "__main__":
    main()
