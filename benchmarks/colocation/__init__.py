"""The served co-location benchmark's parts (benchmarks/bench_colocation.py reads as the experiment): the
repositories (repo), one measured cell under either driver (drive), the simulated ceiling on the same arrivals
(simulate), the figures and verdicts (figures) and the page (page)."""
