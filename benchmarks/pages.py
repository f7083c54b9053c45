"""One command per results page: what re-runs each page at the current commit, with the
repetitions and the noise floor it needs, and what regenerates it from the raw data. A page's design history (a
figure that explains why a default is what it is, from an earlier commit) cites git, ``git show <commit>:<path>``,
not a file in the tree.

    python -m benchmarks.pages                 # every page: its commands and how much of it is generated
    python -m benchmarks.pages decoder         # one page

This prints; it runs nothing (the runs need a quiet machine for hours; run the printed lines there, in order, from
the repository root). Where a page is generated whole (default, decoder, streaming, mixed, regimes, capacity) the last command
rewrites it; the rest are written by hand from the printed figures. Every run writes its raw data with the commit, a
dirty tree flagged (changes under docs/ aside), the machine and the load average (harness.meta), and every verdict
comes from harness.verdict. tests/meta/test_docs_data.py fails where a page marked ``one_commit`` cites data from more
than one commit or a dirty tree, and lists the pages not yet re-run that way."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Page:
    path: str
    generated: str  # "whole", "tables" or "by hand": how much of the page its commands write
    floor: str      # the noise floor the verdicts stand beside
    commands: tuple[str, ...]
    # True once the page holds one run: tests/meta/test_docs_data.py then fails (not warns) where its cited raw data is
    # from more than one commit, a dirty tree, or records none
    one_commit: bool = False
    # the commit that last held a retired benchmark some of the commands run (its data and figures are committed; git
    # keeps the probe): those commands run in a worktree of that commit
    retired_at: str | None = None


PAGES: dict[str, Page] = {
    "default": Page(
        "docs/results/default.md", "whole", "an identical copy of Triton 0 ms (triton_0us_twin) in every cell",
        ("python -m benchmarks.bench_default --models tiny,mlp,resnet50 --loads 0.4,0.9 --reps 3 --duration 8 "
         "--segment 2 --restart --driver both --perf-arrivals seeded --out lazybatch-results/default "
         "--json docs/data/default.json",
         "python -m benchmarks.default_page"), one_commit=True),
    # the README's first command: its two questions in about 4 minutes, run from a clean clone (scripts/quickstart.sh)
    "quickstart": Page(
        "docs/results/quickstart.md", "whole", "an identical copy of Triton 0 ms in every cell",
        ("./scripts/quickstart.sh   # from a clean clone",
         "cp lazybatch-results/quickstart/quickstart.json docs/data/quickstart.json",
         "python -m benchmarks.quickstart --from-data docs/data/quickstart.json --page docs/results/quickstart.md"),
        one_commit=True),
    # the guard on the MLP alone at 70%, before against after (about 25 minutes on 2 cores, the settling round
    # included): the quickstart's one "behind" checked where the floor settles
    "default_mlp": Page(
        "docs/results/default_mlp.md", "by hand", "an identical copy of Triton 0 ms (triton_0us_twin) in every cell",
        ("python -m benchmarks.bench_default --models mlp --loads 0.7 --reps 4 --duration 8 --restart --before a470d47 "
         "--out lazybatch-results/default_mlp --json docs/data/default_guard_7bc9000_mlp.json",), one_commit=True),
    # the guard on the fast models (about 30 minutes on 2 cores) and ResNet-50 (6 draws: 3 proved too few; about 25): a
    # change to the default measured between full runs of the page above
    "default_guard": Page(
        "docs/results/default_guard.md", "by hand", "an identical copy of Triton 0 ms (triton_0us_twin) in every cell",
        ("python -m benchmarks.bench_default --models tiny,mlp --loads 0.4,0.9 --reps 3 --duration 8 "
         "--segment 2 --restart --driver load --perf-arrivals seeded --out lazybatch-results/default_g "
         "--json docs/data/default_guard_14316dc.json",
         "python -m benchmarks.bench_default --models resnet50 --loads 0.4,0.9 --reps 6 --duration 8 "
         "--segment 2 --restart --driver load --perf-arrivals seeded --out lazybatch-results/default_g "
         "--json docs/data/default_guard_14316dc_resnet50.json"), one_commit=True),
    # about 2 h 15 min on 2 cores (an AMD EPYC: t1 is 1.4x the Intel Xeon's; the main sweep about 100 minutes, the
    # LM's light-load cells alone about 25, perf_analyzer about 35). The opt-in eager:join=benefit served beside
    # eager (--variants eager_join) adds a fifth of the sweep and no goal of the page: it was level with eager at
    # 0cd9c15 (0.87-1.18x, `git show 0cd9c15:docs/results/decoder.md`) and is left out, so the page fits a session
    "decoder": Page(
        "docs/results/decoder.md", "whole", "the spread over repetitions (no identical copy in these sweeps)",
        ("python -m benchmarks.bench_decoder --models lm,gnmt,transformer --loads 0.1,0.7,1.5 --reps 3 "
         "--duration 15 --min-requests 20 --out lazybatch-results/decoder "
         "--data docs/data/decoder.json",
         "python -m benchmarks.bench_decoder --models lm,gnmt,transformer --loads 0.7 --reps 3 --duration 30 "
         "--driver perf_analyzer --perf-arrivals seeded --out lazybatch-results/decoder-perf "
         "--data docs/data/decoder_perf_analyzer_seeded.json",
         "python -m benchmarks.decoder_page"), one_commit=True),
    # a page apart from the decoder sweep, so that each runs within a session
    "streaming": Page(
        "docs/results/streaming.md", "whole", "the spread over repetitions (no identical copy in these rounds)",
        tuple(f"python -m benchmarks.bench_streaming --model {m} --loads 0.9,1.2 --reps 3 --duration 12 "
              f"--out lazybatch-results/streaming-{m} --data docs/data/streaming{'' if m == 'lm' else '_' + m}.json"
              for m in ("lm", "gnmt", "transformer"))
        + tuple(f"python -m benchmarks.bench_streaming --model {m} --driver perf_analyzer --perf-arrivals seeded "
                f"--loads 0.9 --reps 3 --duration 12 --out lazybatch-results/streaming-perf-{m} "
                f"--data docs/data/streaming_perf_analyzer{'' if m == 'lm' else '_' + m}.json"
                for m in ("lm", "gnmt", "transformer"))
        + ("python -m benchmarks.streaming_page",), one_commit=True),
    "mixed": Page(
        "docs/results/mixed.md", "whole", "the spread over repetitions (no identical copy yet)",
        ("python -m benchmarks.bench_mixed --models gnmt,resnet50,mlp --loads 0.7,1.2 --reps 3 --duration 30 "
         "--out lazybatch-results/mixed --data docs/data/mixed.json",
         "python -m benchmarks.mixed_page"), one_commit=True),
    # every policy served on four models (generated at 7e215ec, three defaults ago), retired: the default against
    # Triton's batcher is the "default" page above, every policy on a model's own table is `lazybatch simulate`
    "regimes": Page(
        "docs/results/regimes.md", "whole", "the spread over 3 slices per cell",
        ("python -m benchmarks.bench_regimes --quiet-machine",
         "python -m benchmarks.bench_regimes --from-results docs/data/regimes.json"), one_commit=True,
        retired_at="5ad138e"),
    "simulator": Page(
        "docs/simulator.md", "by hand", "20 seeds per point",
        ("lazybatch simulate --paper --out lazybatch-results/paper",
         "lazybatch simulate --rate 1000 --sla-ms 20,40,60,80,100 --seeds 20 --out lazybatch-results/fig15")),
    "npu": Page(
        "docs/npu.md", "by hand", "none needed: cycle counts are deterministic",
        ("python -m benchmarks.bench_npu --json docs/data/npu_scalesim_resnet50.json",
         "python -m benchmarks.bench_npu_served --out lazybatch-results/npu-served"), one_commit=True),
    "onnx": Page(
        "docs/onnx.md", "by hand", "paired chain / whole-graph passes in the same rounds",
        tuple(f"python -m benchmarks.bench_split --models resnet50 --variants plain,ort-all,ort-all-noinplace "
              f"--repeat 15 --json docs/data/bench_split_resnet50_run{k}.json" for k in (1, 2, 3))
        + ("python -m benchmarks.bench_split --models resnet50 --variants plain,ort-all,ort-all-noinplace --repeat 9 "
           "--threads 1 --clock thread --json docs/data/bench_split_resnet50_cputime.json",), one_commit=True),
    "triton": Page(
        "docs/triton.md", "by hand", "t1 again / t1 (overhead), an identical copy of Triton 0 ms (idle cost)",
        ("python -m benchmarks.bench_overhead --rounds 7 --requests 2000 --json docs/data/overhead_mlp.json",
         "git worktree add /tmp/lazybatch-555b6b3 555b6b3  # the retired idle-cost probe lives there",
         *(f"(cd /tmp/lazybatch-555b6b3 && python -m benchmarks.probes.probe_idle_cost --model {m} --rounds 6 "
           f"--requests 200 --variants triton_0us,triton_0us_twin,eager --out lazybatch-results/idle-cost-{m} "
           f"--json docs/data/idle_cost_{m}.json && cp docs/data/idle_cost_{m}.json $OLDPWD/docs/data/)"
           for m in ("mobilenet", "mlp")),
         "git worktree add /tmp/lazybatch-45f1ec2 45f1ec2  # the retired execute-cost probe lives there",
         "(cd /tmp/lazybatch-45f1ec2 && python -m benchmarks.probes.probe_execute_cost --model mobilenet --calls 600 "
         "--group 1 --gap-ms 0 --json docs/data/execute_cost_mobilenet.json && cp docs/data/execute_cost_mobilenet.json "
         "$OLDPWD/docs/data/)",
         "git worktree add /tmp/lazybatch-e15d6b6 e15d6b6  # the retired segments probe lives there",
         "(cd /tmp/lazybatch-e15d6b6 && python -m benchmarks.bench_segments --json docs/data/segments_resnet50_b1.json "
         "&& cp docs/data/segments_resnet50_b1.json $OLDPWD/docs/data/)",
         "(cd /tmp/lazybatch-e15d6b6 && python -m benchmarks.bench_segments --batch 8 --rounds 3 --reps 5 "
         "--json docs/data/segments_resnet50_b8.json && cp docs/data/segments_resnet50_b8.json $OLDPWD/docs/data/)"),
        one_commit=True),
    "monitor": Page(
        "docs/monitor.md", "by hand",
        "6 slices per model, the policies taking turns; the simulator on the same table and arrivals beside it",
        ("python -m benchmarks.bench_monitor_server --durations vgg19=120 --slices 6 --img-dir docs/img "
         "--json docs/data/monitor_server_bench.json",), one_commit=True),
    "operations": Page(
        "docs/operations.md", "by hand", "the spread over repetitions",
        tuple(f"python -m benchmarks.bench_cancel --trials 40 --seed {k} --out lazybatch-results/cancel-{k} "
              f"--json docs/data/cancel_run{k}.json" for k in (1, 2, 3))
        + ("python -m benchmarks.bench_memory --out lazybatch-results/memory --json docs/data/memory_burst.json",
           "python -m benchmarks.bench_memory --variants release --reps 3 --out lazybatch-results/memory-promises "
           "--json docs/data/burst_promises.json",
           "python -m benchmarks.bench_soak --out lazybatch-results/soak --json docs/data/soak_300s.json",
           "python -m benchmarks.bench_soak --duration 1800 --out lazybatch-results/soak-1800 "
           "--json docs/data/soak_1800s.json",
           "python -m benchmarks.bench_soak --from-json docs/data/soak_1800s.json --plot docs/img/soak_1800s.png",
           # the drain figures come from the scale-out tests (3 runs), the busy-core log from the suite itself; both
           # append to their file, so the run starts them afresh (the old lines are another commit's)
           "rm -f docs/data/scale_out_drain.jsonl docs/data/suite_busy_core.txt",
           *(("env LAZYBATCH_DRAIN_FIGURES=docs/data/scale_out_drain.jsonl python -m pytest -q "
              "tests/triton/test_scale_out.py",) * 3),
           "scripts/suite_busy_core.sh 2 docs/data/suite_busy_core.txt"), one_commit=True),
    # only on a lent GPU (the device tool): the figures of docs/deploy.md's "Measured on a GPU"
    "deploy": Page(
        "docs/deploy.md", "by hand", "none: one run of the check, its ratios beside each other",
        ("python3 scripts/gpu_carry.py prepare", "scripts/gpu_check.sh $OUT --commit <sha>  # on the lent GPU, "
         "after the carry calls (docs/deploy.md, \"The GPU check\")")),
    "device_tensors_cpu": Page(
        "docs/deploy.md#cpu", "by hand", "paired chain / whole-graph passes in the same rounds, 3 runs",
        tuple(f"python -m benchmarks.bench_split --models resnet50 bert:small --batch-sizes 1,8 --variants "
              f"plain,device --repeat 9 --json docs/data/bench_split_device_cpu_run{k}.json" for k in (1, 2, 3))),
    # the four-model sweeps in overload (a queue growing with the run: no latency a user sees), retired for the
    # capacity search (colocation_capacity); their pages, data and plots stay, generated at a8a79c0 and e72d3d8
    "colocation": Page(
        "docs/results/colocation.md", "whole", "an identical copy of Triton 0 ms (triton_0us_twin) in every cell",
        ("python -m benchmarks.bench_colocation --reprofile --out lazybatch-results/colocation "
         "--data docs/data/colocation.json --page docs/results/colocation.md",
         "python -m benchmarks.bench_colocation --from-results docs/data/colocation.json "
         "--page docs/results/colocation.md"), one_commit=True, retired_at="0396db8"),
    "colocation_sim": Page("docs/colocation.md", "by hand", "the spread over seeds (simulated, the paper's tables)",
                           ("python -m benchmarks.sim_colocation",), one_commit=True),
    "device_cost": Page("docs/colocation.md#cost", "by hand",
                        "t1 again / t1 (the same call under a second name), routes in turns per request",
                        ("python -m benchmarks.bench_device_cost --json docs/data/device_cost_mlp.json",),
                        one_commit=True, retired_at="e15d6b6"),
    "colocation_light_load": Page("docs/results/colocation_light_load.md", "by hand",
                                  "the spread over 3 repetitions (no identical copy)",
                                  ("python -m benchmarks.probes.probe_device_wait "
                                   "--data docs/data/probe_device_wait.json",), one_commit=True,
                                  retired_at="555b6b3"),
    "colocation_two_widths": Page("docs/results/colocation_two_widths.md", "by hand",
                                  "the spread over 3 rounds, each variant in a process of its own",
                                  ("python -m benchmarks.probes.probe_two_widths --json docs/data/two_widths.json",),
                                  one_commit=True, retired_at="555b6b3"),
    # the CPU share (docs/colocation.md, "The CPU through the operating system"), served on the quickstart's pair
    # about 16 minutes on 2 cores (7 searches of about 8 windows of 5 s, 3 repetitions)
    "colocation_capacity": Page(
        "docs/results/colocation_capacity.md", "whole", "an identical copy of Triton 0 ms searched like the others",
        ("python -m benchmarks.pair --capacity --kinds small=tiny,large=mlp --out lazybatch-results/capacity "
         "--repository lazybatch-results/capacity_repository --twin-repository "
         "lazybatch-results/capacity_twin_repository --json docs/data/colocation_capacity_tiny_mlp.json "
         "--page docs/results/colocation_capacity.md",
         "python -m benchmarks.pair --from-data docs/data/colocation_capacity_tiny_mlp.json "
         "--page docs/results/colocation_capacity.md"), one_commit=True),
    # a second pair of other shapes: tiny beside MobileNet (a CNN, t1 about 10 ms), in windows of 10 s so that a window
    # judges MobileNet down to 23/s; about 20 minutes on 2 cores
    "colocation_capacity_tiny_mobilenet": Page(
        "docs/results/colocation_capacity_tiny_mobilenet.md", "whole",
        "an identical copy of Triton 0 ms searched like the others",
        ("python -m benchmarks.pair --capacity --window 10 --kinds small=tiny,large=mobilenet "
         "--out lazybatch-results/capacity_mobilenet --repository lazybatch-results/capacity_mobilenet_repository "
         "--twin-repository lazybatch-results/capacity_mobilenet_twin_repository "
         "--json docs/data/colocation_capacity_tiny_mobilenet.json "
         "--page docs/results/colocation_capacity_tiny_mobilenet.md",
         "python -m benchmarks.pair --from-data docs/data/colocation_capacity_tiny_mobilenet.json "
         "--page docs/results/colocation_capacity_tiny_mobilenet.md"), one_commit=True),
    "cpu_share": Page("docs/results/cpu_share.md", "whole", "the spread over 5 repetitions (no identical copy)",
                      ("python -m benchmarks.pair --reps 5 --duration 4 --out docs/data/pair_cpu_share "
                       "--page docs/results/cpu_share.md",), one_commit=True),
    "cpu_share_mix": Page(
        "docs/results/cpu_share_mix.md", "whole", "an identical copy of Triton 0 ms (triton_0us_twin) in every cell",
        ("python -m benchmarks.bench_colocation --lineup cpu_share --no-perf --out lazybatch-results/cpu_share_mix "
         "--data docs/data/cpu_share_mix.json --page docs/results/cpu_share_mix.md",
         "python -m benchmarks.bench_colocation --from-results docs/data/cpu_share_mix.json "
         "--page docs/results/cpu_share_mix.md"), one_commit=True, retired_at="0396db8"),
    "cpu_share_levers": Page("docs/results/cpu_share_levers.md", "by hand",
                             "the spread over 3 repetitions (no identical copy)",
                             ("python -m benchmarks.probes.probe_cpu_levers --variants eager_shared,eager_unparked,"
                              "eager_per_session --reps 3 --json docs/data/cpu_levers/levers.json",),
                             one_commit=True, retired_at="555b6b3"),
    "cpu_share_cost": Page("docs/results/cpu_share_cost.md", "whole", "the spread over 3 repetitions",
                           ("python -m benchmarks.bench_cpu_share_cost --data docs/data/cpu_share_cost.json "
                            "--page docs/results/cpu_share_cost.md",), one_commit=True, retired_at="e15d6b6"),
    "cpu_share_sim": Page("docs/colocation.md#the-cpu-through-the-operating-system", "by hand",
                          "the spread over the served run's repetitions (simulated on their arrivals)",
                          ("python -m benchmarks.sim_pair --out docs/data/pair_cpu_share",), one_commit=True,
                          retired_at="5ad138e"),
    "device_lanes": Page("docs/colocation.md#lanes", "by hand", "the spread over 3 repetitions (no identical copy)",
                         ("python -m benchmarks.bench_device_lanes --json docs/data/device_lanes.json",),
                         one_commit=True, retired_at="e15d6b6"),
}


def describe(name: str, page: Page) -> str:
    head = {"whole": "generated whole by the last command",
            "tables": "its tables generated; prose by hand from the new run",
            "by hand": "written by hand from the printed figures"}[page.generated]
    lines = [f"# {name}: {page.path} ({head}; noise floor: {page.floor})"]
    if page.retired_at:
        lines += [f"# retired: run it where git keeps it, at {page.retired_at}, and copy its data back",
                  f"git worktree add /tmp/lazybatch-{page.retired_at} {page.retired_at} && "
                  f"cd /tmp/lazybatch-{page.retired_at}"]
    return "\n".join([*lines, *page.commands])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", help=f"pages to show (default all): {', '.join(PAGES)}")
    args = ap.parse_args(argv)
    unknown = [p for p in args.pages if p not in PAGES]
    if unknown:
        ap.error(f"unknown page(s) {unknown}; choose from {', '.join(PAGES)}")
    print("\n\n".join(describe(n, PAGES[n]) for n in (args.pages or PAGES)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
