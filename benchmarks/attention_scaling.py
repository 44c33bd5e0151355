"""``python -m benchmarks.attention_scaling`` in a checkout: the benchmark is ``laplacianformer.bench.attention_scaling`` (``laplacianformer bench attention_scaling``)."""

from laplacianformer.bench.attention_scaling import main

if __name__ == "__main__":
    main()
