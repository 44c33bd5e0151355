"""``python -m benchmarks.stage_attention`` in a checkout: the benchmark is ``laplacianformer.bench.stage_attention`` (``laplacianformer bench stage_attention``)."""

from laplacianformer.bench.stage_attention import main

if __name__ == "__main__":
    main()
