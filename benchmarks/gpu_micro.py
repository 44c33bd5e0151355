"""``python -m benchmarks.gpu_micro`` from a checkout runs ``laplacianformer.bench.gpu_micro``
(``laplacianformer bench gpu_micro``), where the benchmark lives."""

from laplacianformer.bench.gpu_micro import main

if __name__ == "__main__":
    main()
