"""``python -m benchmarks.cpu_pitfalls`` from a checkout runs ``laplacianformer.bench.cpu_pitfalls``
(``laplacianformer bench cpu_pitfalls``), where the benchmark lives."""

from laplacianformer.bench.cpu_pitfalls import main

if __name__ == "__main__":
    main()
