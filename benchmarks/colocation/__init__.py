"""The co-located pair's parts (benchmarks/pair.py reads as the experiment): the pair served under each
configuration and judged against each model alone (pair), and the best-effort capacity beside a latency-critical
model (capacity)."""
