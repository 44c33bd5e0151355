"""``python -m benchmarks.roofline`` in a checkout: the benchmark is ``laplacianformer.bench.roofline`` (``laplacianformer bench roofline``)."""

from laplacianformer.bench.roofline import main

if __name__ == "__main__":
    main()
