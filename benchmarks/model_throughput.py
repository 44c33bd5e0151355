"""``python -m benchmarks.model_throughput`` from a checkout runs ``laplacianformer.bench.model_throughput``
(``laplacianformer bench model_throughput``), where the benchmark lives."""

from laplacianformer.bench.model_throughput import main

if __name__ == "__main__":
    main()
