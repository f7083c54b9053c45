"""Objects are built whole: what a class's constructor sets from one of its parameters is not written from outside.

A collaborator, a callable or a setting that a constructor takes is the object's own from then on; code elsewhere
that assigns it afterwards (``other.gate = ...``) makes the object's behaviour depend on who touched it last, and a
reader of the class cannot see it (docs/architecture.md, "Built whole"). A change of state goes through a method of
the class that owns it (``route.hold(until)``, ``watcher.pace(stage_s)``).

The check parses every module of the package (``ast``). For each class, the attributes its ``__init__`` sets from an
expression that reads one of its parameters are that class's built attributes. An assignment (``=``, ``+=``) to one
of them through an object of that class other than its own ``self`` is an outside write. Records and statistics (``RECORDS``: their
fields are the data they carry, written by whoever fills them) are exempt by type: an attribute built only by them
is not checked. An object whose class cannot be told from the code (an unannotated parameter, ``Any``) is not
checked either: annotate it, and the check sees it.
"""

from __future__ import annotations

import ast
from collections import defaultdict

from tests.meta.test_layers import ROOT, package_modules

# records and statistics, whose fields are written by whoever fills them: exempt by type
RECORDS = {
    "Request", "StageJob", "StageResult", "RequestOptions", "Parent", "Sample",  # a request and its parts
    "Entry", "_Batch", "_Seq",  # a BatchTable entry, graph batching's batch, a seq2seq sequence: the policy's rows
    "RuntimeStats", "Histogram", "DecisionLog",  # statistics
}


def package_trees() -> dict[str, ast.Module]:
    """Every module of the package, parsed, by its path in the repository."""
    return {str(p.relative_to(ROOT)): ast.parse(p.read_text(), str(p)) for p in package_modules().values()}


def _class_named(annotation: ast.AST | None, classes: set[str]) -> str | None:
    """The first known class an annotation names (``Foo``, ``"Foo"``, ``Foo | None``, ``Optional[Foo]``)."""
    if annotation is None:
        return None
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return None
    for n in ast.walk(annotation):
        name = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else None
        if name in classes:
            return name
    return None


def _made(value: ast.AST, classes: set[str]) -> str | None:
    """``Foo(...)``: Foo, where it is a known class."""
    if isinstance(value, ast.Call):
        f = value.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None
        return name if name in classes else None
    return None


class Classes:
    """Each class of the package: the attributes its constructor sets from a parameter (``built``), and the class
    of each attribute where the constructor says it (``Foo(...)``, or a parameter annotated ``Foo``)."""

    def __init__(self, trees: dict[str, ast.Module]) -> None:
        defs = [n for tree in trees.values() for n in ast.walk(tree) if isinstance(n, ast.ClassDef)]
        self.names = {c.name for c in defs}
        self.built: dict[str, set[str]] = defaultdict(set)
        self.types: dict[str, dict[str, str]] = defaultdict(dict)
        for cls in defs:
            for init in (f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"):
                a = init.args
                args = [p for p in a.posonlyargs + a.args + a.kwonlyargs if p.arg != "self"]
                params = {p.arg for p in args} | {p.arg for p in (a.vararg, a.kwarg) if p is not None}
                annotated = {p.arg: _class_named(p.annotation, self.names) for p in args}
                for node in ast.walk(init):
                    if isinstance(node, ast.Assign):
                        targets, ann = node.targets, None
                    elif isinstance(node, ast.AnnAssign) and node.value is not None:
                        targets, ann = [node.target], node.annotation
                    else:
                        continue
                    selfs = [t for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                             and t.value.id == "self"]
                    v = node.value
                    kind = _class_named(ann, self.names) or _made(v, self.names) or \
                        (annotated.get(v.id) if isinstance(v, ast.Name) else None)
                    from_param = any(isinstance(n, ast.Name) and n.id in params for n in ast.walk(v))
                    for t in selfs:
                        if from_param:
                            self.built[cls.name].add(t.attr)
                        if kind:
                            self.types[cls.name][t.attr] = kind

    def of(self, expr: ast.AST, cls: str | None, local: dict[str, str]) -> str | None:
        """The class of ``expr`` where it can be told: ``self`` in a method, a local or a parameter whose class
        is known, or an attribute of one of those whose class its constructor says."""
        if isinstance(expr, ast.Name):
            return cls if expr.id == "self" else local.get(expr.id)
        if isinstance(expr, ast.Attribute):
            owner = self.of(expr.value, cls, local)
            return self.types.get(owner, {}).get(expr.attr) if owner else None
        return None


def _locals(fn: ast.FunctionDef | ast.AsyncFunctionDef, classes: Classes) -> dict[str, str]:
    """A function's names whose class is known: annotated parameters, and names assigned ``Foo(...)``."""
    a = fn.args
    out = {p.arg: k for p in a.posonlyargs + a.args + a.kwonlyargs
           if (k := _class_named(p.annotation, classes.names))}
    for node in ast.walk(fn):
        if isinstance(node, ast.Assign) and (k := _made(node.value, classes.names)):
            out.update({t.id: k for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and \
                (k := _class_named(node.annotation, classes.names)):
            out[node.target.id] = k
    return out


def outside_writes(trees: dict[str, ast.Module]) -> dict[tuple[str, str, str], int]:
    """(module path, "Class.attribute", the object's expression) -> line, for each write (``=``, ``+=``) to an
    attribute that its class's constructor sets from a parameter, through an object other than that class's own
    ``self``, where the object's class can be told (a record's fields are exempt: ``RECORDS``)."""
    classes = Classes(trees)
    found: dict[tuple[str, str, str], int] = {}
    for rel, tree in trees.items():
        owners = {id(f): c.name for c in ast.walk(tree) if isinstance(c, ast.ClassDef) for f in c.body}
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            cls = owners.get(id(fn))
            local = _locals(fn, classes)
            for node in ast.walk(fn):
                if isinstance(node, ast.Assign):
                    targets = node.targets
                elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
                    targets = [node.target]
                else:
                    continue
                for t in (x for tgt in targets for x in ast.walk(tgt)):
                    if not isinstance(t, ast.Attribute) or not isinstance(t.ctx, ast.Store):
                        continue
                    if isinstance(t.value, ast.Name) and t.value.id == "self":
                        continue  # its own
                    kind = classes.of(t.value, cls, local)
                    if kind and kind not in RECORDS and t.attr in classes.built.get(kind, ()):
                        found.setdefault((rel, f"{kind}.{t.attr}", ast.unparse(t.value)), node.lineno)
    return found


def test_no_constructor_setting_is_written_from_outside():
    new = outside_writes(package_trees())
    assert not new, "attributes a constructor sets from its parameters, written from outside (give the class a " \
        "method, or pass the value to its constructor):\n" + "\n".join(
            f"  {m}:{line}: {obj}.{attr.split('.')[1]} = ... ({attr})" for (m, attr, obj), line in sorted(new.items()))


def test_every_record_named_is_a_class_of_the_package():
    assert RECORDS <= Classes(package_trees()).names


def test_the_check_finds_an_outside_write_and_leaves_records_and_own_writes_alone():
    src = """
class Gate:
    def __init__(self, sock, name):
        self.sock = sock
        self.label = f"gate {name}"
        self.state = 0                      # not from a parameter: not a built attribute
    def reset(self, sock):
        self.sock = sock                    # its own method: fine
class Request:
    def __init__(self, rid):
        self.rid = rid
class Owner:
    def __init__(self, gate: Gate):
        self.gate = gate
def rejoin(gate: "Gate | None", sock, request: Request, owner: Owner, other):
    gate.sock = sock                        # outside write
    gate.state = 1                          # not built: not checked here
    request.rid = 2                         # a record's field: exempt
    owner.gate.label += "!"                 # outside write through another object
    other.sock = sock                       # its class cannot be told: not checked
"""
    found = outside_writes({"m.py": ast.parse(src)})
    assert set(found) == {("m.py", "Gate.sock", "gate"), ("m.py", "Gate.label", "owner.gate")}, found


MUTATORS = {"append", "appendleft", "extend", "extendleft", "insert", "pop", "popleft", "remove", "clear", "rotate"}


def part_writes(trees: dict[str, ast.Module]) -> list[str]:
    """Writes by a policy's parts (the modules under batcher/policies/ that keep their policy as ``self.policy``,
    read through a local such as ``pol``) to the policy's state: an assignment to one of its attributes, or a
    list or deque of it changed in place (``pol.stack.append``)."""
    found = []
    for rel, tree in trees.items():
        if "batcher/policies/" not in rel:
            continue
        for fn in (n for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            pols = {t.id for node in ast.walk(fn) if isinstance(node, ast.Assign)
                    and ast.unparse(node.value) == "self.policy" for t in node.targets if isinstance(t, ast.Name)}

            def is_policy(e: ast.AST) -> bool:
                return (isinstance(e, ast.Name) and e.id in pols) or ast.unparse(e) == "self.policy"

            for node in ast.walk(fn):
                targets = node.targets if isinstance(node, ast.Assign) else \
                    [node.target] if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else []
                for t in targets:
                    if isinstance(t, ast.Attribute) and is_policy(t.value):
                        found.append(f"{rel}:{node.lineno}: {ast.unparse(t)} = ...")
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
                        node.func.attr in MUTATORS and isinstance(node.func.value, ast.Attribute) and \
                        is_policy(node.func.value.value):
                    found.append(f"{rel}:{node.lineno}: {ast.unparse(node.func)}(...)")
    return found


def test_a_policys_parts_change_its_state_only_through_its_methods():
    """The eager policy's parts (the urgency rule, the decoder admission, the preemption rule: batcher/policies/eager/)
    read their policy's InfQ and BatchTable stack, and change them only through the policy's own moves
    (``take``, ``run_ahead``, ``queue_first``) or by returning a decision that the policy applies
    (``UrgencyRule.split`` returns the entry to push)."""
    found = part_writes(package_trees())
    assert not found, "a part writes its policy's state (give the policy a method):\n" + "\n".join(found)


def test_the_parts_check_finds_a_write_to_the_policys_state():
    src = """
class Rule:
    def move(self):
        pol = self.policy
        pol.infq = []                       # an assignment
        pol.stack.append(1)                 # an in-place change
        self.policy.cap += 1                # through self.policy
        n = len(pol.stack)                  # a read: fine
        pol.merge_top(0)                    # the policy's own move: fine
"""
    assert len(part_writes({"batcher/policies/eager/rule.py": ast.parse(src)})) == 3
