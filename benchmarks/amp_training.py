"""``python -m benchmarks.amp_training`` in a checkout: the benchmark is ``laplacianformer.bench.amp_training`` (``laplacianformer bench amp_training``)."""

from laplacianformer.bench.amp_training import main

if __name__ == "__main__":
    main()
