"""Benchmarks: time and memory of the ops, layers, models and detectors, and the demo's cost panel.

Each benchmark is a module with ``main(argv)`` (``python -m laplacianformer.bench.NAME``, or
``laplacianformer bench NAME``); ``registry`` lists them with their smoke-test arguments. They share one
harness (``harness``: timing, peak RSS, live heap, saved activations), the forced op backends
(``backends``), the machine description (``machine``), the writers (``report``), the allocator setting
(``allocator``), the common timing options (``options``), child processes that import this package copy
(``process``) and one output rule (``output``): a run directory under the current directory by default,
the published results only with ``--publish``.
"""
