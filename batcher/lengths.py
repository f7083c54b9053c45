"""Output-length (decoder timestep) histograms and the dec_timesteps they imply.

Algorithm 1 multiplies DECODER stage latencies by ``dec_timesteps``, chosen to cover N% (default 90%) of the output
lengths seen when the model was characterised (the paper's Fig. 11). A histogram file is JSON::

    {"format": "lazybatch.length_histogram/1", "provenance": "...", "lengths": [1, 2, ...], "counts": [..]}

or CSV with a ``length,count`` header.
"""

from __future__ import annotations

import bisect
import csv
import io
import json
import random
from itertools import accumulate
from pathlib import Path
from typing import Any, Mapping, Sequence

from .errors import ConfigError

FORMAT = "lazybatch.length_histogram/1"


class LengthHistogram:
    __slots__ = ("lengths", "counts", "provenance", "_cum", "_total")

    def __init__(self, lengths: Sequence[int], counts: Sequence[float], *, provenance: str = "",
                 source: str | None = None) -> None:
        if len(lengths) != len(counts) or not lengths:
            raise ConfigError(f"lengths and counts must be non-empty lists of equal size (got {len(lengths)} and "
                              f"{len(counts)})", field="counts", source=source)
        pairs = []
        for ln, c in zip(lengths, counts):
            if not isinstance(ln, int) or isinstance(ln, bool) or ln < 1:
                raise ConfigError(f"lengths must be positive integers, got {ln!r}", field="lengths", source=source)
            if not isinstance(c, (int, float)) or isinstance(c, bool) or c < 0:
                raise ConfigError(f"counts must be non-negative numbers, got {c!r}", field="counts", source=source)
            pairs.append((ln, float(c)))
        pairs.sort()
        if len({p[0] for p in pairs}) != len(pairs):
            raise ConfigError("a length appears twice", field="lengths", source=source)
        self.lengths = [p[0] for p in pairs]
        self.counts = [p[1] for p in pairs]
        self._cum = list(accumulate(self.counts))
        self._total = self._cum[-1]
        if self._total <= 0:
            raise ConfigError("all counts are zero", field="counts", source=source)
        self.provenance = provenance

    def coverage_length(self, coverage: float) -> int:
        """Smallest length L such that at least ``coverage`` of the mass has length <= L."""
        if not 0 < coverage <= 1:
            raise ConfigError(f"coverage must be in (0, 1], got {coverage!r}", field="dec_timesteps_coverage")
        k = bisect.bisect_left(self._cum, coverage * self._total - 1e-9)
        return self.lengths[min(k, len(self.lengths) - 1)]

    def conditional_length(self, done: int, coverage: float) -> int:
        """Smallest length L > ``done`` such that at least ``coverage`` of the mass above ``done`` has length <= L:
        how far a sequence that has already run ``done`` steps is expected to go (``done + 1`` past the longest)."""
        if not 0 < coverage <= 1:
            raise ConfigError(f"coverage must be in (0, 1], got {coverage!r}", field="dec_timesteps_coverage")
        k0 = bisect.bisect_right(self.lengths, done)
        below = self._cum[k0 - 1] if k0 else 0.0
        beyond = self._total - below
        if k0 >= len(self.lengths) or beyond <= 0:
            return done + 1
        k = bisect.bisect_left(self._cum, below + coverage * beyond - 1e-9, lo=k0)
        return self.lengths[min(k, len(self.lengths) - 1)]

    def conditional_mean(self, done: int) -> float:
        """Mean length of the sequences longer than ``done`` (``done + 1`` past the longest)."""
        k0 = bisect.bisect_right(self.lengths, done)
        mass = self._total - (self._cum[k0 - 1] if k0 else 0.0)
        if k0 >= len(self.lengths) or mass <= 0:
            return float(done + 1)
        return sum(ln * c for ln, c in zip(self.lengths[k0:], self.counts[k0:])) / mass

    def fraction_at_most(self, length: int) -> float:
        k = bisect.bisect_right(self.lengths, length)
        return self._cum[k - 1] / self._total if k else 0.0

    def mean(self) -> float:
        return sum(ln * c for ln, c in zip(self.lengths, self.counts)) / self._total

    def sample(self, rng: random.Random, n: int) -> list[int]:
        return rng.choices(self.lengths, cum_weights=self._cum, k=n)

    def to_dict(self) -> dict[str, Any]:
        return {"format": FORMAT, "provenance": self.provenance, "lengths": self.lengths,
                "counts": [int(c) if float(c).is_integer() else c for c in self.counts]}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str | None = None) -> "LengthHistogram":
        if not isinstance(data, Mapping):
            raise ConfigError("expected a JSON object", source=source)
        if data.get("format", FORMAT) != FORMAT:
            raise ConfigError(f"unsupported format {data.get('format')!r}; expected {FORMAT!r}", field="format",
                              source=source)
        for key in ("lengths", "counts"):
            if not isinstance(data.get(key), list):
                raise ConfigError("a list is required", field=key, source=source)
        return cls(data["lengths"], data["counts"], provenance=str(data.get("provenance", "")), source=source)

    @classmethod
    def load(cls, path: str | Path) -> "LengthHistogram":
        p = Path(path)
        try:
            text = p.read_text()
        except OSError as e:
            raise ConfigError(f"cannot read length histogram: {e.strerror}", source=str(p)) from None
        if p.suffix.lower() == ".csv":
            reader = csv.DictReader(io.StringIO(text))
            if reader.fieldnames is None or not {"length", "count"} <= set(reader.fieldnames):
                raise ConfigError("CSV header must be 'length,count'", field="header", source=str(p))
            lengths, counts = [], []
            for line, row in enumerate(reader, start=2):
                try:
                    lengths.append(int(row["length"]))
                    counts.append(float(row["count"]))
                except (TypeError, ValueError):
                    raise ConfigError(f"line {line}: length must be an integer and count a number",
                                      field="length/count", source=str(p)) from None
            return cls(lengths, counts, source=str(p))
        try:
            data = json.loads(text)
        except json.JSONDecodeError as e:
            raise ConfigError(f"not valid JSON ({e.msg} at line {e.lineno})", source=str(p)) from None
        return cls.from_dict(data, source=str(p))

    def save(self, path: str | Path) -> Path:
        p = Path(path)
        if p.suffix.lower() == ".csv":
            p.write_text("length,count\n" + "".join(f"{ln},{c:g}\n" for ln, c in zip(self.lengths, self.counts)))
        else:
            p.write_text(json.dumps(self.to_dict()) + "\n")
        return p
