"""Per-sample sizes for a model's dynamic input dimensions: what warm-up, profiling and load generators feed.

A dim of -1 (any size) cannot be fed as 1 in many graphs: a detector's 1x1 image fails at its first Concat of
feature maps. `lazybatch split` records the sizes it ran the model at (the manifest's ``example_dims``) and
`lazybatch repo add` copies them into config.pbtxt as the ``example_dims`` parameter, so that the backend's
whole-graph warm-up, our load generator and perf_analyzer's ``--shape`` all use a size the model accepts.

The text form is perf_analyzer's ``--shape`` value, one per input, separated by ``;``: ``images:3,320,320``.
"""

from __future__ import annotations

from typing import Mapping, Sequence


def format_example_dims(examples: Mapping[str, Sequence[int]]) -> str:
    """``{"images": (3, 320, 320)}`` -> ``"images:3,320,320"``."""
    return ";".join(f"{name}:{','.join(str(int(d)) for d in dims)}" for name, dims in examples.items())


def parse_example_dims(text: str | None) -> dict[str, tuple[int, ...]]:
    """The inverse of ``format_example_dims``; ValueError says which part is wrong."""
    out: dict[str, tuple[int, ...]] = {}
    for part in (text or "").split(";"):
        part = part.strip()
        if not part:
            continue
        name, sep, dims = part.rpartition(":")
        try:
            sizes = tuple(int(d) for d in dims.split(","))
        except ValueError:
            sizes = ()
        if not sep or not name or not sizes or any(d < 1 for d in sizes):
            raise ValueError(f"{part!r} is not NAME:D1,D2,... with sizes >= 1 (e.g. images:3,320,320)")
        out[name] = sizes
    return out


def feed_shape(dims: Sequence[int], example: Sequence[int] | None) -> tuple[int, ...]:
    """A sample's shape for ``dims`` (no batch dimension): the example where there is one that fits, else each -1
    as 1."""
    if example is not None and len(example) == len(dims):
        return tuple(int(e) if d < 0 else int(d) for d, e in zip(dims, example))
    return tuple(int(d) if d > 0 else 1 for d in dims)
