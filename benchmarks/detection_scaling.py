"""``python -m benchmarks.detection_scaling`` from a checkout runs ``laplacianformer.bench.detection_scaling``
(``laplacianformer bench detection_scaling``), where the benchmark lives."""

from laplacianformer.bench.detection_scaling import main

if __name__ == "__main__":
    main()
