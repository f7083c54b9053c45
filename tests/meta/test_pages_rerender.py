"""The generated results pages render again from the committed raw data (docs/data/), byte for byte: a change to a
generator or to the verdict rule (benchmarks/harness/verdict.py) that would change a published verdict fails
here, and the page must then be regenerated with it (no server: the saved runs only)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DATA, RESULTS = ROOT / "docs" / "data", ROOT / "docs" / "results"


@pytest.mark.parametrize("name", ["decoder", "streaming"])
def test_the_decoder_and_streaming_pages_render_byte_for_byte(tmp_path, name):
    """The decoder page (its sweep under both drivers) and the streaming page (three models, both drivers) from
    their raw data, plots into a scratch folder."""
    import importlib

    gen = importlib.import_module(f"benchmarks.{name}_page")
    page = tmp_path / "results" / f"{name}.md"
    assert gen.main(["--page", str(page), "--img-dir", str(tmp_path / "img")]) == 0
    assert page.read_text() == (RESULTS / f"{name}.md").read_text()


def test_the_mixed_page_renders_byte_for_byte(tmp_path):
    """The mixed-traffic page from its one run (docs/data/mixed.json), plot into a scratch folder."""
    from benchmarks import mixed_page

    page = tmp_path / "results" / "mixed.md"
    assert mixed_page.main(["--page", str(page), "--img-dir", str(tmp_path / "img")]) == 0
    assert page.read_text() == (RESULTS / "mixed.md").read_text()


def test_the_default_page_renders_byte_for_byte(tmp_path):
    """The static-models page from its one run (docs/data/default.json), verdict included."""
    from benchmarks import default_page

    page = tmp_path / "results" / "default.md"
    assert default_page.main(["--page", str(page), "--img-dir", str(tmp_path / "img")]) == 0
    assert page.read_text() == (RESULTS / "default.md").read_text()


def test_the_readme_static_line_is_the_default_pages_verdict():
    """The README's "Where it stands" row for static models is the one the page's data gives."""
    from benchmarks import default_page

    line = default_page.readme_line(json.loads((DATA / "default.json").read_text()))
    assert len(line) < 250
    assert line in (ROOT / "README.md").read_text().splitlines()


def test_the_readme_mixed_line_is_the_mixed_pages_verdict():
    from benchmarks import mixed_page

    line = mixed_page.readme_line(json.loads((DATA / "mixed.json").read_text()))
    assert line in (ROOT / "README.md").read_text().splitlines()


def test_the_readme_decoder_and_streaming_lines_are_their_pages_verdicts():
    from benchmarks import decoder_page, streaming_page

    lines = (ROOT / "README.md").read_text().splitlines()
    for gen in (decoder_page, streaming_page):
        line = gen.readme_line(gen.load(DATA))
        assert len(line) < 250 and line in lines


def test_the_colocation_capacity_page_renders_byte_for_byte(tmp_path):
    """The co-location capacity page (benchmarks/colocation/capacity.py) from its one run, plot into a scratch
    folder laid out like docs/."""
    pytest.importorskip("matplotlib")
    from benchmarks.colocation import capacity

    data = json.loads((DATA / "colocation_capacity_tiny_mlp.json").read_text())
    page = tmp_path / "results" / "colocation_capacity.md"
    capacity.page(data, page, json_path=tmp_path / "data" / "colocation_capacity_tiny_mlp.json")
    assert page.read_text() == (RESULTS / "colocation_capacity.md").read_text()
