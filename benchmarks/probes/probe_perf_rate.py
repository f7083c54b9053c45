"""What perf_analyzer offers when asked for a Poisson rate: its own send times (--profile-export-file), against
one model of a built repository, with that model's valid seq2seq input data where it has one.

    python -m benchmarks.probes.probe_perf_rate --repo lazybatch-results/decoder-load70/repos/gnmt --model gnmt_triton_0us

Per asked rate, perf_analyzer's own schedule, then the same rate drawn with a seed here and handed over as
--request-intervals (`lazybatch perf --poisson-seed`): the requests sent, the rate they make, and the coefficient of
variation of the gaps (1 for Poisson arrivals). Then the first gaps of each rate's own schedule times that rate: a
schedule drawn afresh on each run would give unrelated numbers; equal ones mean every run replays one sequence.
Why: bench_decoder's perf_analyzer cells served fewer requests a second than asked (docs/results/decoder.md).
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path


from benchmarks.harness import served
from lazybatch import perf as pa
from lazybatch.client.api import Client
from lazybatch.client.seq2seq import info_from_parameters, perf_input_data


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repo", required=True, help="a model repository (e.g. one bench_decoder built)")
    ap.add_argument("--model", required=True, help="the model of that repository to load and send to")
    ap.add_argument("--rates", default="3", help="comma list of asked request rates (/s)")
    ap.add_argument("--measurement-ms", type=int, default=8000, help="perf_analyzer's window (3 are taken)")
    ap.add_argument("--out", default="lazybatch-results/perf-rate")
    args = ap.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    with served(Path(args.repo), out / "tritonserver.log",
                extra_args=["--model-control-mode=explicit", f"--load-model={args.model}"]) as server:
        url = server.endpoints.grpc
        with Client(url) as c:
            info = info_from_parameters(c.model_parameters(args.model))
        data = None
        if info is not None:
            data = out / "input.json"
            data.write_text(json.dumps(perf_input_data(info, seed=0)))
        own: dict[float, list[float]] = {}
        for rate in (float(r) for r in args.rates.split(",")):
            for seed in (None, 1):
                export = out / f"export_{rate:g}_{'own' if seed is None else 'seeded'}.json"
                pa.run(pa.find_perf_analyzer() or pa.install(), args.model, url, [rate], out,
                       measurement_ms=args.measurement_ms, input_data=str(data) if data else None, max_trials=3,
                       stability_percentage=10000, extra=["--profile-export-file", str(export)],
                       poisson_seed=seed)
                ts = sorted(r["timestamp"] for e in json.loads(export.read_text())["experiments"]
                            for r in e["requests"])
                gaps = [(b - a) / 1e9 for a, b in zip(ts, ts[1:])]
                span, mean_gap = (ts[-1] - ts[0]) / 1e9, statistics.fmean(gaps)
                sent = (len(ts) - 1) / span
                print(f"asked {rate:g}/s, {'its own schedule' if seed is None else 'seeded arrivals'}: {len(ts)} "
                      f"sends over {span:.1f} s = {sent:.2f}/s ({sent / rate:.2f} of the asked rate); gaps: mean "
                      f"{mean_gap * 1e3:.0f} ms, CV {statistics.pstdev(gaps) / mean_gap:.2f}")
                if seed is None:
                    own[rate] = [g * rate for g in gaps[:12]]
        for rate, scaled in own.items():
            print(f"its own schedule at {rate:g}/s, the first gaps x rate: " + " ".join(f"{g:.2f}" for g in scaled))
    return 0


if __name__ == "__main__":
    sys.exit(main())
