"""``python -m benchmarks.gpu_targets`` from a checkout runs ``laplacianformer.bench.gpu_targets``
(``laplacianformer bench gpu_targets``), where the benchmark lives."""

from laplacianformer.bench.gpu_targets import main

if __name__ == "__main__":
    main()
