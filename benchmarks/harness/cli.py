"""The options the served sweeps share, and the order they measure their cells in."""

from __future__ import annotations

from typing import Any, Iterator, Sequence, TypeVar

T = TypeVar("T")


def add_sweep_args(ap: Any, *, loads: str, reps: int, duration: float, out: str, data: str) -> None:
    """The options every served sweep takes: --loads (fractions of the batch-1 rate), --reps, --duration, --out,
    --data (a copy of the raw results, e.g. for docs/data/); parse with ``parse_sweep_args``."""
    ap.add_argument("--loads", default=loads, help=f"fractions of the batch-1 rate ({loads})")
    ap.add_argument("--reps", type=int, default=reps, help=f"repetitions per cell ({reps})")
    ap.add_argument("--duration", type=float, default=duration, help=f"seconds of arrivals per cell ({duration:g})")
    ap.add_argument("--out", default=out, help="results folder")
    ap.add_argument("--data", default=None,
                    help=f"also copy the raw results here (none unless given; the docs' copy is {data})")


def add_perf_arrivals_arg(ap: Any, driver: str) -> None:
    """--perf-arrivals, the same for every benchmark with a perf_analyzer driver (``driver``: its name there)."""
    ap.add_argument("--perf-arrivals", choices=("perf_analyzer", "seeded"), default="perf_analyzer",
                    help=f"{driver}: perf_analyzer's own Poisson schedule (its default; the same sequence on every "
                         "run, so the repetitions are the same arrivals) or arrivals drawn with each repetition's seed "
                         "(`lazybatch perf --poisson-seed`, perf_analyzer's --request-intervals)")


def parse_sweep_args(ap: Any, argv: list[str] | None) -> Any:
    args = ap.parse_args(argv)
    args.loads = [float(x) for x in args.loads.split(",")]
    return args


def turns(loads: Sequence[float], reps: int, policies: Sequence[str], desc: str) -> Iterator[tuple[float, int, str]]:
    """(load, repetition, policy) in the order the served sweeps measure them, with a progress bar: at each load every
    repetition runs every policy once, taking turns, the order reversed every other repetition (no policy always
    runs first after a load change)."""
    from tqdm import tqdm

    for f, k in tqdm([(f, k) for f in loads for k in range(reps)], desc=desc, unit="rep"):
        for pol in (list(policies) if k % 2 == 0 else list(reversed(policies))):
            yield f, k, pol


def turned(items: Sequence[T], k: int) -> list[T]:
    """``items`` starting at the k-th (modulo their count): turn k's order, so that each configuration opens a turn
    as often as the others."""
    k %= len(items)
    return list(items[k:]) + list(items[:k])
