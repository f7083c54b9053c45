"""What the benchmarks share, so each stays a short script that reads like its experiment: the machine and commit a
figure comes from (meta), repetitions summarised with their spread (stats), the sweeps' common options (cli), a
tritonserver started and stopped for a run and its counters (served), what is measured on it (measure), plots
(plots), markdown tables and pages (page), and the one verdict rule every page uses (verdict). The names are re-exported here: ``from
benchmarks.harness import ...``."""

from benchmarks.harness.cli import add_perf_arrivals_arg, add_sweep_args, parse_sweep_args, turns
from benchmarks.harness.measure import (PerfMeasuredNothing, perf_row, seq2seq_requests, seq2seq_t1, served_table,
                                        static_t1)
from benchmarks.harness.meta import ROOT, command_line, git_commit, machine_meta, write_json
from benchmarks.harness.served import served, settled_stats, start_server, triton_stats
from benchmarks.harness.stats import fmt, geomean, held_out_ratios, percentile, spread, verdict
from benchmarks.harness.verdict import count, count_line, judge, judge_spread, judge_value

__all__ = ["ROOT", "add_perf_arrivals_arg", "add_sweep_args", "command_line", "count", "count_line", "fmt", "geomean",
           "git_commit", "held_out_ratios", "judge", "judge_spread", "judge_value", "machine_meta", "parse_sweep_args",
           "PerfMeasuredNothing", "percentile", "perf_row", "seq2seq_requests", "seq2seq_t1", "served", "served_table",
           "settled_stats", "spread", "start_server", "static_t1", "triton_stats", "turns", "verdict", "write_json"]
