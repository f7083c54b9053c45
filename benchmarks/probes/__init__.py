"""Probes: one-question diagnostics behind a figure in the docs (why a cell came out as it did), each run as
``python -m benchmarks.probes.<name>``; their output is quoted, not regenerated, by the results pages."""
