"""A results.json written before, rendered again (``--from-results``): later runs' models joined in, the figures
added since (simulated replay, time scale) filled in from the files the runs kept, nothing measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

from benchmarks.harness import runtime_stats
from benchmarks.regimes.policies import Settings
from benchmarks.regimes.replay import add_simulated


def load_results(files: list[Path], st: Settings, data_copy: Path | None) -> tuple[dict, Settings]:
    """The saved run of ``files[0]``, ``files[1:]`` (later runs) joining its models or replacing the same model's
    results, with the settings it ran with; copied to ``data_copy`` unless that is where it came from."""
    saved = json.loads(files[0].read_text())
    home = {r["model"]: files[0].parent for r in saved["results"]}  # where each model's run kept its files
    for f in files[1:]:  # further runs: their models join the page or replace the same model's earlier results
        more = json.loads(f.read_text())
        home |= {r["model"]: f.parent for r in more["results"]}
        newer = {r["model"]: r for r in more["results"]}
        saved["results"] = [newer.pop(r["model"], r) for r in saved["results"]] + list(newer.values())
        saved["meta"].setdefault("extra_runs", []).append(
            {k: more["meta"].get(k, "?") for k in ("command", "started", "finished", "elapsed_min",
                                                    "loadavg_before", "loadavg_after", "commit")}
            | {"alternating": more["meta"].get("alternating", False)}
            | {"models": [r["model"] for r in more["results"]]})
    if "settings" in saved["meta"]:
        st = Settings(**(saved["meta"]["settings"] | {"out": Path(saved["meta"]["settings"]["out"])}))
    for res in saved["results"]:  # results from before the simulated figures: add them from the run's table
        add_simulated(res, st, home.get(res["model"]))
    if data_copy is not None and files[0].resolve() != data_copy.resolve():
        saved["meta"]["data_copy"] = str(data_copy)
        data_copy.parent.mkdir(parents=True, exist_ok=True)
        data_copy.write_text(json.dumps(saved, indent=1))
    m = saved["meta"]  # a results file written before the run ended (after each model) lacks these
    for k, v in (("finished", "? (run not finished)"), ("elapsed_min", math.nan), ("loadavg_after", "?"),
                 ("shared", True), ("results_json", str(files[0]))):
        m.setdefault(k, v)
    m.setdefault("tritonserver", saved["results"][0]["tritonserver"] if saved["results"] else "?")
    for res in saved["results"]:  # a run's statistics files, when the results predate time_scale in them
        if "time_scale" not in res and "lazy" in st.policies:
            final = runtime_stats(st.out / "stats" / res["model"], f"{res['model']}_lazy", timeout=0.0)
            if "time_scale" in final:
                res["time_scale"] = final["time_scale"]
    return saved, st
