"""One report for both load drivers: ``lazybatch load`` (load.json) and perf_analyzer (perf.json) side by side.

Why: the two drivers measure differently (our open-loop client counts client-side latency per request and SLA
violations; perf_analyzer reports its own percentiles and the server's queue/compute split), and users compare a
model's rows from both. Both commands call :func:`write_combined` on their output folder, so running
``lazybatch load ... --out D`` and ``lazybatch perf ... --out D`` in either order leaves ``D/report.csv`` and
``D/report.md`` with every row of both, keyed by (model, offered rate). Streamed models (gRPC streams) add the
time to first token and per output token from both drivers (perf_analyzer's from its profile export).
"""

from __future__ import annotations

import csv
import json
import math
from pathlib import Path
from typing import Any

COLUMNS = ("model", "rate", "driver", "throughput", "avg_ms", "p50_ms", "p90_ms", "p99_ms", "sla_violation_rate",
           "errors", "server_queue_ms", "server_compute_ms", "ttft_avg_ms", "ttft_p99_ms", "tpot_avg_ms")
STREAM_COLUMNS = ("ttft_avg_ms", "ttft_p99_ms", "tpot_avg_ms")


def _num(v: Any) -> float:
    try:
        return float(v)
    except (TypeError, ValueError):
        return math.nan


def _read(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return []
    return data if isinstance(data, list) else []


def combined_rows(out_dir: str | Path) -> list[dict[str, Any]]:
    """Rows of load.json and perf.json in ``out_dir``, in COLUMNS, sorted by model, rate, driver."""
    d = Path(out_dir)
    rows: list[dict[str, Any]] = []
    for r in _read(d / "load.json"):
        rows.append({"model": r.get("model"), "rate": _num(r.get("offered_rate")), "driver": "lazybatch load",
                     "throughput": _num(r.get("throughput")), "avg_ms": _num(r.get("avg_ms")),
                     "p50_ms": _num(r.get("p50_ms")), "p90_ms": _num(r.get("p90_ms")),
                     "p99_ms": _num(r.get("p99_ms")), "sla_violation_rate": _num(r.get("sla_violation_rate")),
                     "errors": int(_num(r.get("errors")) or 0), "server_queue_ms": math.nan,
                     "server_compute_ms": math.nan} | {k: _num(r.get(k)) for k in STREAM_COLUMNS})
    for r in _read(d / "perf.json"):
        rows.append({"model": r.get("model"), "rate": _num(r.get("request_rate")), "driver": "perf_analyzer",
                     "throughput": _num(r.get("throughput")), "avg_ms": _num(r.get("avg_ms")),
                     "p50_ms": _num(r.get("p50_ms")), "p90_ms": _num(r.get("p90_ms")),
                     "p99_ms": _num(r.get("p99_ms")), "sla_violation_rate": math.nan,
                     "errors": 0, "server_queue_ms": _num(r.get("server_queue_ms")),
                     "server_compute_ms": _num(r.get("server_compute_ms"))}
                    | {k: _num(r.get(k)) for k in STREAM_COLUMNS})
    rows.sort(key=lambda r: (str(r["model"]), r["rate"], r["driver"]))
    return rows


def _fmt(v: Any, pct: bool = False) -> str:
    if isinstance(v, float):
        if math.isnan(v):
            return "-"
        return f"{v * 100:.1f}%" if pct else f"{v:.2f}"
    return str(v)


def write_combined(out_dir: str | Path) -> Path | None:
    """Write ``report.csv`` and ``report.md`` in ``out_dir`` from whatever of load.json/perf.json is there.

    Returns the markdown path, or None when neither file exists."""
    d = Path(out_dir)
    rows = combined_rows(d)
    if not rows:
        return None
    with open(d / "report.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(COLUMNS))
        w.writeheader()
        w.writerows(rows)
    streamed = any(not math.isnan(r["ttft_avg_ms"]) for r in rows)  # the columns only where a model streamed
    lines = ["| model | rate/s | driver | throughput/s | avg ms | p50 ms | p90 ms | p99 ms | SLA violations | errors "
             "| server queue ms | server compute ms |" + (" TTFT avg ms | TTFT p99 ms | TPOT avg ms |" if streamed
                                                          else ""), "|" + "---|" * (15 if streamed else 12)]
    for r in rows:
        lines.append("| " + " | ".join([
            str(r["model"]), f"{r['rate']:g}", r["driver"], _fmt(r["throughput"]), _fmt(r["avg_ms"]),
            _fmt(r["p50_ms"]), _fmt(r["p90_ms"]), _fmt(r["p99_ms"]), _fmt(r["sla_violation_rate"], pct=True),
            str(r["errors"]), _fmt(r["server_queue_ms"]), _fmt(r["server_compute_ms"]),
            *([_fmt(r[k]) for k in STREAM_COLUMNS] if streamed else [])]) + " |")
    note = ("\nSLA violations are counted by `lazybatch load` only (perf_analyzer does not know the SLA); the "
            "server's queue/compute split comes from perf_analyzer only. perf_analyzer's rate is what it was asked "
            "for; see its log for the rate it achieved.\n")
    md = d / "report.md"
    md.write_text("\n".join(lines) + "\n" + note)
    return md
