"""``laplacianformer demo``: the recipe (``recipe``), the job scheduler (``scheduler``), the report
(``report``) and the run that ties them together (``run.run_demo``). The cost panel is the
``bench.model_cost`` benchmark, measured with the benchmarks' harness."""
