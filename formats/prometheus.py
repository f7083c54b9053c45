"""Series out of a Prometheus text scrape: what the backend's metrics (backend/metrics.py) look like to a reader
of Triton's metrics endpoint (the soak test, the tests, the benchmarks)."""

from __future__ import annotations

import re
from typing import Iterable


def parse_samples(text: str, family: str) -> Iterable[tuple[dict[str, str], float]]:
    """(labels, value) of every series of ``family`` in a Prometheus text scrape (for tests and benchmarks)."""
    pat = re.compile(r"^" + re.escape(family) + r"(\{(?P<labels>[^}]*)\})?\s+(?P<value>\S+)$")
    lab = re.compile(r'(\w+)="((?:[^"\\]|\\.)*)"')
    for line in text.splitlines():
        mt = pat.match(line.strip())
        if mt:
            yield dict(lab.findall(mt.group("labels") or "")), float(mt.group("value"))
