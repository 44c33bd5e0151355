"""``python -m benchmarks.kernels`` in a checkout: the benchmark is ``laplacianformer.bench.kernels`` (``laplacianformer bench kernels``)."""

from laplacianformer.bench.kernels import main

if __name__ == "__main__":
    main()
