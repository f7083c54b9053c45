"""bench_regimes' parts (the script itself is the CLI): policies (what is served and how the page names it), sweep
(the served cells of one model), perf (the same cells from perf_analyzer), replay (the scaling curve and the
simulated run on the same table), verdicts (the goals, met or not), page and plots (the results page), saved (a
results.json rendered again)."""
