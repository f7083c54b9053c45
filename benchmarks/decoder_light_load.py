"""Light-load cells of a bench_decoder run, request by request: what 10% load can resolve on this machine.

    python -m benchmarks.decoder_light_load docs/data/decoder.json --load 0.1

Every policy of a repetition gets the same requests at the same send times (bench_decoder seeds each repetition),
so requests pair across policies. A request is *alone* where, under both eager and Triton's batcher at 0 ms, no
earlier request was still in flight when it was sent and the next one was sent after it finished: nothing could
share a step with it, so the two latencies differ only by the machine's drift between the two cells. The rest
*overlapped*: that is where scheduling differs. Per model and repetition: how many of each, their mean latencies
under both, and the median per-request ratio Triton 0 ms / eager.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys


def split(eager: list, triton: list) -> tuple[list, list]:
    """(alone, overlapped) pairs of (eager ms, triton ms); records are [send offset s, latency ms or None]."""
    alone, over = [], []
    busy_until = float("-inf")  # the latest finish, under either policy, of the requests sent so far
    for i, (a, b) in enumerate(zip(eager, triton)):
        sent = a[0]
        if a[1] is not None and b[1] is not None:
            busy_after = i + 1 < len(eager) and (eager[i + 1][0] < sent + a[1] / 1e3
                                                 or triton[i + 1][0] < sent + b[1] / 1e3)
            (over if busy_until > sent or busy_after else alone).append((a[1], b[1]))
        for r in (a, b):
            if r[1] is not None:
                busy_until = max(busy_until, r[0] + r[1] / 1e3)
    return alone, over


def summary(pairs: list) -> str:
    if not pairs:
        return "0"
    n = len(pairs)
    ratio = statistics.median(t / e for e, t in pairs)
    return (f"{n} requests, eager {sum(e for e, _ in pairs) / n:.0f} ms, triton 0 ms {sum(t for _, t in pairs) / n:.0f}"
            f" ms, median Triton / eager {ratio:.2f}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("data", help="a bench_decoder decoder.json (with per-request records)")
    ap.add_argument("--load", type=float, default=0.1)
    args = ap.parse_args(argv)
    res = json.load(open(args.data))
    for m in res["models"]:
        by = {(c["load"], c["rep"], c["policy"]): c for c in m["cells"]}
        for k in sorted({c["rep"] for c in m["cells"] if c["load"] == args.load}):
            e, t = by[args.load, k, "eager"], by[args.load, k, "triton_0us"]
            if "records" not in e:
                print(f"{m['model']}: no per-request records in this file (bench_decoder before 646c0e4)")
                break
            alone, over = split(e["records"], t["records"])
            print(f"{m['model']} rep {k}: alone: {summary(alone)}; overlapped: {summary(over)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
