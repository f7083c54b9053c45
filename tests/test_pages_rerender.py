"""The results pages' generated tables render again from the committed raw data (docs/data/), row for row as the
pages print them: a change to a generator or to the verdict rule (benchmarks/harness/verdict.py) that would change a
published verdict fails here, and the page must then be regenerated with it (no server: the saved runs only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DATA, RESULTS = ROOT / "docs" / "data", ROOT / "docs" / "results"


def _rows(lines: list[str]) -> list[str]:
    """The rendered table rows and pooled lines (the header and prose around them are the page's own)."""
    return [x for x in lines if (x.startswith("| ") and not x.startswith("| ---")) or x.startswith("**Pooled")]


def _default(name: str) -> list[str]:
    from benchmarks import bench_default

    runs = (lambda d: d.get("runs", [d]))(json.loads((DATA / name).read_text()))
    every = [res for r in runs for res in r["results"]]
    lines = [x for res in every for d in sorted({c["driver"] for c in res["cells"]}) for x in bench_default.report(res, d)]
    return lines + [x for d in ("load", "perf") for x in bench_default.pooled_line(every, d)]


def _models(module: str, name: str) -> list[str]:
    import importlib

    report = importlib.import_module(f"benchmarks.{module}").report
    return [x for m in json.loads((DATA / name).read_text())["models"] for x in report(m)]


CASES = [("default.md", lambda: _default("default.json")),
         ("default.md", lambda: _default("default_restart.json")),
         ("default.md", lambda: _default("default_perf_analyzer.json")),
         ("default.md", lambda: _default("default_perf_analyzer_seeded.json")),
         ("mixed.md", lambda: _models("bench_mixed", "mixed.json")),
         ("mixed.md", lambda: _models("bench_mixed", "mixed_gnmt.json"))]


@pytest.mark.parametrize("page, render", CASES, ids=[f"{p}:{i}" for i, (p, _) in enumerate(CASES)])
def test_generated_rows_are_on_the_page(page, render):
    text = (RESULTS / page).read_text()
    rows = _rows(render())
    assert rows
    missing = [r for r in rows if r not in text]
    assert not missing, f"{page} no longer shows what its data renders to:\n" + "\n".join(missing[:5])


def test_the_regimes_page_renders_byte_for_byte(tmp_path):
    """The whole page from its raw data (plots into a scratch folder laid out like docs/)."""
    pytest.importorskip("matplotlib")
    from benchmarks import bench_regimes

    page, img, data = tmp_path / "results" / "regimes.md", tmp_path / "img", tmp_path / "data" / "regimes.json"
    assert bench_regimes.main(["--from-results", str(DATA / "regimes.json"), "--page", str(page), "--img-dir",
                               str(img), "--data", str(data), "--out", str(tmp_path / "work")]) == 0
    assert page.read_text() == (RESULTS / "regimes.md").read_text()


def test_the_decoder_page_renders_byte_for_byte(tmp_path):
    """The decoder page (decoding and streaming, eight data files) from its raw data, plot into a scratch folder."""
    from benchmarks import decoder_page

    page = tmp_path / "results" / "decoder.md"
    assert decoder_page.main(["--page", str(page), "--img-dir", str(tmp_path / "img")]) == 0
    assert page.read_text() == (RESULTS / "decoder.md").read_text()


def test_the_mixed_page_renders_from_its_data(tmp_path):
    """Its generator on the committed run: every goal of every cell judged, the served tables below. (Byte for byte
    once docs/results/mixed.md is regenerated from one re-run: benchmarks/pages.py, mixed.)"""
    from benchmarks import bench_mixed, mixed_page

    page = tmp_path / "results" / "mixed.md"
    assert mixed_page.main(["--page", str(page), "--img-dir", str(tmp_path / "img")]) == 0
    text = page.read_text()
    res = json.loads((DATA / "mixed.json").read_text())
    cells = {(m["model"], c["load"], c["policy"]) for m in res["models"] for c in m["cells"]}
    ours = {(m, f, p) for m, f, p in cells if p in bench_mixed.OURS}
    assert len(mixed_page.goal_rows(res)) == 3 * len(ours)
    assert all(r in text for r in _rows(bench_mixed.report(res["models"][0])))
