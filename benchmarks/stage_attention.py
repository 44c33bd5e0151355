"""``python -m benchmarks.stage_attention`` from a checkout runs ``laplacianformer.bench.stage_attention``
(``laplacianformer bench stage_attention``), where the benchmark lives."""

from laplacianformer.bench.stage_attention import main

if __name__ == "__main__":
    main()
