"""Traffic classes: the callers of one model that differ in deadline and priority (interactive beside bulk).

One spec per class, ``NAME:SHARE:SLA_MS[:PRIORITY]`` (``lazybatch load --class``), e.g.::

    --class interactive:0.2:20:1 --class bulk:0.8:200:2

SHARE is the class's fraction of the requests (the shares add up to 1), SLA_MS its SLA target (``none`` for no
deadline) and PRIORITY its request priority, Triton's convention: 1 is the most urgent level, 0 (the default) the
model's default level. Each request is drawn into a class at random with the shares, seeded, so that two runs with
one seed send the same classes in the same order.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any, Sequence

import numpy as np

from lazybatch.batcher.errors import ConfigError

SPEC = "NAME:SHARE:SLA_MS[:PRIORITY]"


@dataclass(frozen=True)
class TrafficClass:
    name: str
    share: float
    sla_ms: float | None
    priority: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def parse_class(text: str) -> TrafficClass:
    """One ``NAME:SHARE:SLA_MS[:PRIORITY]`` spec; a ConfigError that names the part that is wrong."""
    parts = [p.strip() for p in str(text).split(":")]
    if len(parts) not in (3, 4):
        raise ConfigError(f"traffic class {text!r}: expected {SPEC}, e.g. interactive:0.2:20:1", field="--class")
    name, share_s, sla_s = parts[:3]
    if not name or not name.replace("_", "").replace("-", "").isalnum():
        raise ConfigError(f"traffic class {text!r}: the name must be letters, digits, '-' or '_'", field="--class")
    try:
        share = float(share_s)
    except ValueError:
        raise ConfigError(f"traffic class {name!r}: share {share_s!r} is not a number (a fraction of the requests, "
                          f"e.g. 0.2)", field="--class") from None
    if not (0.0 < share <= 1.0):
        raise ConfigError(f"traffic class {name!r}: share must be in (0, 1], got {share_s}", field="--class")
    if sla_s.lower() == "none":
        sla = None
    else:
        try:
            sla = float(sla_s)
        except ValueError:
            raise ConfigError(f"traffic class {name!r}: SLA {sla_s!r} is not a number of ms (or 'none')",
                              field="--class") from None
        if not (sla > 0.0) or not math.isfinite(sla):
            raise ConfigError(f"traffic class {name!r}: SLA must be a positive number of ms, got {sla_s}",
                              field="--class")
    priority = 0
    if len(parts) == 4:
        try:
            priority = int(parts[3])
        except ValueError:
            raise ConfigError(f"traffic class {name!r}: priority {parts[3]!r} is not an integer (1 is the most urgent "
                              f"level, 0 the model's default)", field="--class") from None
        if priority < 0:
            raise ConfigError(f"traffic class {name!r}: priority must be >= 0 (1 is the most urgent level, 0 the "
                              f"model's default), got {priority}", field="--class")
    return TrafficClass(name, share, sla, priority)


def parse_classes(specs: Sequence[str]) -> list[TrafficClass]:
    """Several specs; the names must differ and the shares add up to 1."""
    classes = [parse_class(s) for s in specs]
    return check_classes(classes)


def check_classes(classes: Sequence[TrafficClass]) -> list[TrafficClass]:
    if not classes:
        raise ConfigError("give at least one traffic class", field="--class")
    names = [c.name for c in classes]
    dup = sorted({n for n in names if names.count(n) > 1})
    if dup:
        raise ConfigError(f"traffic class names must differ: {', '.join(dup)} given twice", field="--class")
    total = sum(c.share for c in classes)
    if abs(total - 1.0) > 1e-6:
        raise ConfigError(f"the shares of the traffic classes must add up to 1, got {total:g} "
                          f"({' + '.join(f'{c.share:g}' for c in classes)})", field="--class")
    return list(classes)


def assign(classes: Sequence[TrafficClass], n: int, seed: int) -> list[int]:
    """The class (index) of each of ``n`` requests, drawn with the shares; seeded."""
    if len(classes) == 1:
        return [0] * n
    rng = np.random.default_rng([seed, 18])  # a stream of its own: the arrival times stay those of the seed
    p = np.array([c.share for c in classes], dtype=float)
    return [int(i) for i in rng.choice(len(classes), size=n, p=p / p.sum())]
