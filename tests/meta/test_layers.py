"""Imports run one way: down the layers below, never back up.

Every module of the installed package and of ``benchmarks/`` is parsed (``ast``: imports inside functions and under
``TYPE_CHECKING`` count too, since a lazy import is still a dependency). Each layer names the layers it may import;
a layer may name only layers listed before it, so the layers form a stack with no way back up. Two layers that
do not name each other (``backend`` and ``client``, say) import nothing from each other.

=========  ============================  ====================================================================
layer      import names                  may import, and why
=========  ============================  ====================================================================
core       ``lazybatch.batcher`` (and    nothing: the scheduler core, standard library only (checked)
           the bare ``lazybatch``, its
           ``__version__``)
formats    ``lazybatch.formats``         core. What a served model, its clients and the simulator all read:
                                         Triton datatypes as numpy dtypes, the Prometheus text, the shipped
                                         length histograms; numpy and the standard library only (checked)
sessions   ``lazybatch.sessions``        core. How onnxruntime sessions of a split model are made and run:
                                         thread pools, in-place stages, host checks, segments, StageChain
traffic    ``lazybatch.traffic``         core. Traffic classes, drawn alike by the load generator and the
                                         simulator
onnx       ``lazybatch.onnx_tools``      core, formats, sessions: export, split, verify, profile (the offline
                                         tools that write the stage folders the backend serves)
npu        ``lazybatch.npu_model``       core, formats, onnx: the NPU timing model; ``paper.py`` regenerates its
                                         shipped tables by exporting and splitting the paper's models
backend    ``lazybatch.backend``         core, formats, sessions, npu: the Triton Python backend
client     ``lazybatch.client``          core, formats, traffic: nothing of the backend (it talks to a server)
simulator  ``lazybatch.simulator``       core, formats, traffic, npu
cli        the rest of ``lazybatch``     all of the above: commands, ``repo``, ``serving``, ``scale_out``,
                                         ``perf``, ``staging``
benchmarks ``benchmarks``                everything; nothing in the package imports them
=========  ============================  ====================================================================
"""

from __future__ import annotations

import ast
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# layer name -> (import-name prefixes, layers it may import); the longest matching prefix decides a module's layer
LAYERS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "core": (("lazybatch.batcher",), ()),
    "formats": (("lazybatch.formats",), ("core",)),
    "sessions": (("lazybatch.sessions",), ("core",)),
    "traffic": (("lazybatch.traffic",), ("core",)),
    "onnx": (("lazybatch.onnx_tools",), ("core", "formats", "sessions")),
    "npu": (("lazybatch.npu_model",), ("core", "formats", "onnx")),
    "backend": (("lazybatch.backend",), ("core", "formats", "sessions", "npu")),
    "client": (("lazybatch.client",), ("core", "formats", "traffic")),
    "simulator": (("lazybatch.simulator",), ("core", "formats", "traffic", "npu")),
    "cli": (("lazybatch",), ("core", "formats", "sessions", "traffic", "onnx", "npu", "backend", "client",
                             "simulator")),
    "benchmarks": (("benchmarks",), ("core", "formats", "sessions", "traffic", "onnx", "npu", "backend", "client",
                                     "simulator", "cli")),
}
ROOT_PACKAGE = "lazybatch"  # its __init__ holds only the version: core, whoever imports it
# third-party modules a layer may use besides the standard library (a layer not named here: any)
THIRD_PARTY = {"core": set(), "formats": {"numpy"}}


def layer_of(module: str) -> str | None:
    if module == ROOT_PACKAGE:
        return "core"
    best, best_len = None, -1
    for name, (prefixes, _) in LAYERS.items():
        for p in prefixes:
            if (module == p or module.startswith(p + ".")) and len(p) > best_len:
                best, best_len = name, len(p)
    return best


def package_modules() -> dict[str, Path]:
    """Import name -> file of every module, from pyproject's package-dir mapping plus benchmarks/."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    mapping = dict(mapping, benchmarks="benchmarks")
    out: dict[str, Path] = {}
    for package, folder in mapping.items():
        base = ROOT / folder
        for path in base.rglob("*.py"):
            rel = path.relative_to(base).with_suffix("").parts
            if any(part in ("data", "out") or part.startswith(".") for part in rel[:-1]):
                continue
            parts = rel[:-1] if rel[-1] == "__init__" else rel
            out[".".join((package, *parts))] = path
    return out


def imports(module: str, path: Path, known: set[str]) -> list[tuple[int, str]]:
    """(line, imported module) of every import in the file, relative ones resolved; ``from X import y`` names the
    module ``X.y`` where that is a module."""
    is_pkg = path.name == "__init__.py"
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if is_pkg else module.split(".")[:-1]
                base = base[:len(base) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for a in node.names:
                sub = f"{target}.{a.name}"
                out.append((node.lineno, sub if sub in known else target))
    return sorted(set(out))


def violations() -> list[str]:
    mods = package_modules()
    known = set(mods)
    stdlib = set(sys.stdlib_module_names) | {"__future__"}
    bad = []
    for module, path in sorted(mods.items()):
        src = layer_of(module)
        for line, target in imports(module, path, known):
            where = f"{path.relative_to(ROOT)}:{line}: {module} ({src})"
            top = target.split(".")[0]
            if top in ("lazybatch", "benchmarks"):
                dst = layer_of(target)
                if dst is None or dst == src or target == ROOT_PACKAGE:
                    continue
                if dst not in LAYERS[src][1]:
                    bad.append(f"{where} imports {target} ({dst}), which layer {src} may not import")
            elif src in THIRD_PARTY and top not in stdlib and top not in THIRD_PARTY[src]:
                bad.append(f"{where} imports {target}, which layer {src} may not use")
    return bad


def test_imports_run_down_the_layers():
    bad = violations()
    assert not bad, "imports that run back up (tests/meta/test_layers.py says the layers):\n" + "\n".join(bad)


def test_layers_form_a_stack():
    """Each layer may import only layers listed before it: no cycle, whatever is edited later."""
    names = list(LAYERS)
    for i, (name, (_, uses)) in enumerate(LAYERS.items()):
        assert set(uses) <= set(names[:i]), f"{name} may import a layer listed after it: {uses}"


def test_every_module_has_a_layer():
    """A new top-level folder must be given a layer here (package_modules() reads pyproject's mapping)."""
    mapping = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"]
    assert all(layer_of(p) is not None for p in mapping), mapping


def test_the_check_sees_lazy_imports(tmp_path):
    """An import inside a function is found, and relative imports resolve to their package."""
    f = tmp_path / "m.py"
    f.write_text("from .x import y\n\ndef g():\n    from lazybatch.backend.stages import StageRunner\n")
    got = imports("lazybatch.client.m", f, {"lazybatch.client.x"})
    assert got == [(1, "lazybatch.client.x"), (4, "lazybatch.backend.stages")]
