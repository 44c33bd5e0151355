"""``python -m benchmarks.launch_census`` from a checkout runs ``laplacianformer.bench.launch_census``
(``laplacianformer bench launch_census``), where the benchmark lives."""

from laplacianformer.bench.launch_census import main

if __name__ == "__main__":
    main()
