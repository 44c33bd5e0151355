"""``python -m benchmarks.amp_training`` from a checkout runs ``laplacianformer.bench.amp_training``
(``laplacianformer bench amp_training``), where the benchmark lives."""

from laplacianformer.bench.amp_training import main

if __name__ == "__main__":
    main()
