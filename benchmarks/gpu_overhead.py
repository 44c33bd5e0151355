"""``python -m benchmarks.gpu_overhead`` in a checkout: the benchmark is ``laplacianformer.bench.gpu_overhead`` (``laplacianformer bench gpu_overhead``)."""

from laplacianformer.bench.gpu_overhead import main

if __name__ == "__main__":
    main()
