"""Replays: a served run's latency tables replayed in the simulator under other rules, as
``python -m benchmarks.replays.<name>``; nothing is served."""
