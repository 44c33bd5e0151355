"""``python -m benchmarks.attention_scaling`` from a checkout runs ``laplacianformer.bench.attention_scaling``
(``laplacianformer bench attention_scaling``), where the benchmark lives."""

from laplacianformer.bench.attention_scaling import main

if __name__ == "__main__":
    main()
