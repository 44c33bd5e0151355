"""``python -m benchmarks.model_throughput`` in a checkout: the benchmark is ``laplacianformer.bench.model_throughput`` (``laplacianformer bench model_throughput``)."""

from laplacianformer.bench.model_throughput import main

if __name__ == "__main__":
    main()
