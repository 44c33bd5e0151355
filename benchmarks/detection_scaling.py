"""``python -m benchmarks.detection_scaling`` in a checkout: the benchmark is ``laplacianformer.bench.detection_scaling`` (``laplacianformer bench detection_scaling``)."""

from laplacianformer.bench.detection_scaling import main

if __name__ == "__main__":
    main()
