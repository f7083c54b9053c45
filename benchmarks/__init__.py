"""The benchmarks: scripts run from the repository root as modules (``python -m benchmarks.bench_default``,
``python -m benchmarks.quickstart``), so they import each other and the shared harness
(``benchmarks.harness``) by package name, with no ``sys.path`` edits. Not installed with lazybatch: see README.md."""
