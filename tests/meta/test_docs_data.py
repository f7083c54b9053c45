"""Data hygiene for the docs (docs/results/README.md): every file under docs/data/ is cited by a page (a markdown link or a
path mention in docs/**.md or README.md), and every docs/data/ path a page cites exists. A citation may name a
folder (it covers the files under it), use shell braces (``cancel_run{1,2,3}.json``) or a ``*`` glob. A path
written as ``git show <commit>:docs/data/...`` is history (an earlier run, kept in git, not in the tree) and is not
a citation of the tree's files.

A page benchmarks/pages.py marks ``one_commit`` (it holds one run) fails where its cited raw data comes from more
than one commit, from a tree with uncommitted changes (``+dirty``) or records no commit at all. The other pages are
reported, not failed (the re-runs that fix them need a quiet machine: benchmarks/pages.py names the command per
page); ``pytest -rw tests/meta/test_docs_data.py`` prints the list."""

from __future__ import annotations

import fnmatch
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROVENANCE = "PROVENANCE.txt"  # a data folder's one line of provenance for files that cannot hold their own
DATA = ROOT / "docs" / "data"
TOKEN = re.compile(r"[\w./{}*,+-]*data/[\w./{}*,+-]*")
HISTORY = re.compile(r"git show [0-9a-f]{7,40}:[\w./{}*,+-]+")  # a file as it was at a commit: git holds it


def pages() -> list[Path]:
    return sorted(p for p in [ROOT / "README.md", *(ROOT / "docs").rglob("*.md")] if DATA not in p.parents)


def expand(s: str) -> list[str]:
    """Shell brace expansion: ``a{1,2}b`` -> ``a1b``, ``a2b``."""
    m = re.search(r"\{([^{}]*)\}", s)
    if not m:
        return [s]
    return [x for part in m.group(1).split(",") for x in expand(s[:m.start()] + part + s[m.end():])]


def citations(page: Path) -> list[str]:
    """The docs/data paths ``page`` mentions, relative to docs/data (braces expanded, globs kept)."""
    out = []
    for tok in TOKEN.findall(HISTORY.sub("", page.read_text())):
        tok = tok.rstrip(".,`'\")")
        if tok.startswith("docs/data/"):  # from the repository root, in commands and prose alike
            path = ROOT / tok
        else:
            path = (page.parent / tok).resolve()
        if not (path == DATA or DATA in path.parents):
            continue  # another folder named data (lazybatch/simulator/data, tests' data)
        rel = path.relative_to(DATA).as_posix()
        if rel != ".":
            out += expand(rel.removesuffix("/"))
    return out


def files() -> list[str]:
    return sorted(p.relative_to(DATA).as_posix() for p in DATA.rglob("*") if p.is_file())


def covers(cited: str, f: str) -> bool:
    return fnmatch.fnmatchcase(f, cited) or f.startswith(cited + "/")


def cited_by() -> dict[Path, list[str]]:
    """Per page, the data files its citations cover."""
    every = files()
    return {p: sorted({f for c in citations(p) for f in every if covers(c, f)}) for p in pages()}


def test_every_data_file_is_cited_by_a_page():
    cited = {f for fs in cited_by().values() for f in fs}
    uncited = [f for f in files() if f not in cited]
    assert not uncited, "docs/data files no page cites (cite them or delete them: git keeps history):\n" + \
        "\n".join(uncited)


def test_every_cited_data_path_exists():
    every = files()
    missing = [f"{p.relative_to(ROOT)}: docs/data/{c}" for p in pages() for c in citations(p)
               if not any(covers(c, f) for f in every)]
    assert not missing, "pages cite docs/data paths that are not there:\n" + "\n".join(missing)


def test_no_data_files_among_the_pages():
    """Raw data lives in docs/data/, pages in docs/results/ (and docs/)."""
    stray = sorted(p.name for p in (ROOT / "docs" / "results").iterdir() if p.suffix != ".md")
    assert not stray, f"data files in docs/results/ (move them to docs/data/): {stray}"
    rendered = sorted(p.name for p in DATA.rglob("*.md"))
    assert not rendered, f"pages in docs/data/ (move them to docs/results/): {rendered}"


def _commits(obj: object) -> list[str]:
    """Every commit a raw-data JSON records (keys named commit, in meta, machine, info, runs...)."""
    out: list[str] = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            if k == "commit" and isinstance(v, str):
                out.append(v)
            elif isinstance(v, (dict, list)) and k not in ("cells", "rows"):
                out += _commits(v)
    elif isinstance(obj, list):
        for v in obj[:100]:
            out += _commits(v)
    return out


def provenance(rel: str) -> tuple[set[str], bool] | None:
    """(the short commits, any from a dirty tree) a data file records; None where it records none; CSV tables and
    batch logs carry no header to record one in and are not judged."""
    p = DATA / rel
    if p.suffix == ".json":
        try:
            raw = _commits(json.loads(p.read_text()))
        except ValueError:
            raw = []
    elif p.suffix in (".txt", ".jsonl"):
        raw = re.findall(r"commit[\"']?[ :=]+[\"'`]?([0-9a-f]{7,40}(?:\+dirty| \+ uncommitted changes)?)", p.read_text())
    else:
        return set(), False
    if not raw:
        folder = p.parent / PROVENANCE  # a folder of files that cannot record one (a device's raw output) says it once
        if p.name != PROVENANCE and folder.exists():
            return provenance(str(folder.relative_to(DATA)))
        return None
    return {c[:7] for c in raw}, any("dirty" in c or "uncommitted" in c for c in raw)


def mixed_pages() -> list[str]:
    """One line per page whose cited data is from several commits, a dirty tree, or no recorded commit."""
    lines = []
    for page, fs in cited_by().items():
        commits, dirty, none = set(), [], []
        for f in fs:
            prov = provenance(f)
            if prov is None:
                none.append(f)
                continue
            commits |= prov[0]
            if prov[1]:
                dirty.append(f)
        if len(commits) > 1 or dirty or none:
            lines.append(f"{page.relative_to(ROOT)}: {len(commits)} commits"
                         + (f"; from a dirty tree: {', '.join(dirty)}" if dirty else "")
                         + (f"; no commit recorded: {', '.join(none)}" if none else ""))
    return lines


def one_commit_pages() -> set[str]:
    """The pages benchmarks/pages.py marks as holding one run (their anchors dropped)."""
    from benchmarks.pages import PAGES

    return {p.path.split("#")[0] for p in PAGES.values() if p.one_commit}


def test_pages_that_hold_one_run_cite_data_from_one_clean_commit():
    marked = one_commit_pages()
    assert marked, "benchmarks/pages.py marks no page one_commit"
    bad = [line for line in mixed_pages() if line.split(":")[0] in marked]
    assert not bad, "pages marked one_commit whose cited data is not from one clean commit (re-run them with " \
        "`python -m benchmarks.pages <page>`, or stop citing the odd file):\n" + "\n".join(bad)


# Pages whose data is known not to come from one clean commit, with why; each is re-run when it can be. The test
# fails where any other page's data is mixed, and where a page named here is clean again (drop it from here).
NOT_ONE_COMMIT = {
    "docs/deploy.md": "the GPU check ran at aada3a2 with its scripts not yet committed (docs/data/gpu/PROVENANCE.txt); "
                      "it re-runs only on a lent GPU",
}


def test_every_page_cites_data_from_one_clean_commit():
    """Every page's figures come from one recorded commit of a clean tree, the named exceptions aside."""
    mixed = {line.split(":")[0]: line for line in mixed_pages()}
    bad = [line for page, line in mixed.items() if page not in NOT_ONE_COMMIT]
    assert not bad, "pages whose cited data is not from one clean commit (re-run them with `python -m " \
        "benchmarks.pages <page>`, or stop citing the odd file):\n" + "\n".join(bad)
    stale = sorted(set(NOT_ONE_COMMIT) - set(mixed))
    assert not stale, f"pages now from one clean commit: remove them from NOT_ONE_COMMIT: {stale}"
    assert "from a dirty tree" in mixed["docs/deploy.md"] and "no commit recorded" not in mixed["docs/deploy.md"]


def test_the_checks_see_what_they_should(tmp_path):
    assert expand("cancel_run{1,2}.json") == ["cancel_run1.json", "cancel_run2.json"]
    assert expand("a{16,32}_{s,l}.csv") == ["a16_s.csv", "a16_l.csv", "a32_s.csv", "a32_l.csv"]
    assert covers("npu_sim_*.csv", "npu_sim_x.csv") and covers("gpu", "gpu/check.json")
    assert not covers("gpu", "gpu_other.json")
    page = tmp_path / "p.md"
    page.write_text("[x](../data/x.json), `docs/data/y_{1,2}.json`, lazybatch/simulator/data/z.json, ../data/, "
                    "`git show 0cd9c15:docs/data/old.json`.")
    # a page outside docs/ resolves its relative link elsewhere; docs/data/ paths resolve from the root
    assert citations(page) == ["y_1.json", "y_2.json"]
    assert _commits({"meta": {"commit": "abc1234 + uncommitted changes"}, "cells": [{"commit": "x"}]}) == \
        ["abc1234 + uncommitted changes"]
