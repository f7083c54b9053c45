"""Each benchmark's report from its raw cells, shared by the benchmark script (which prints it after a run) and its\npage generator (which renders it from docs/data/): neither imports the other."""
