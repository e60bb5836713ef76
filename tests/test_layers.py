"""The layers of `patcher/`, read from its own imports: no cycle, and each layer keeps its side.

The graph holds every import the code can run: module level, inside functions, under
`TYPE_CHECKING`, and the modules named to `lazy_import` or `importlib.import_module`, with
`from . import x` resolved to the module `x` when it is one. Importing `sglpatch.a.b` runs
`sglpatch.a` first, so it counts as an import of both (unless the importer is inside `a`).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import pytest

PACKAGE = "sglpatch"
ROOT = Path(__file__).resolve().parent.parent / "patcher"

# The public face of the ledger: all `api/` may import from `sglpatch.store`. The journal, the
# git plumbing, the state's JSON and the paths inside a record stay behind it.
STORE_API = {
    "Entry",
    "FileRecord",
    "Ledger",
    "Record",
    "RevertPlan",
    "State",
    "default_directory",
    "file_digest",
    "finish_interrupted",
    "originals_of_patched",
    "plan_revert",
    "record_apply",
    "record_revert",
    "sha256",
    "state_now",
    "write_output",
}
# What only the ledger may say: the folders inside a record and its files' names.
LEDGER_LAYOUT = ("original/", "patched/", "edited/", "files/", "state.json", "target.json")


class Import(NamedTuple):
    """One import in a module: the module it names, its line, and the names taken `from` it."""

    module: str
    line: int
    names: tuple[str, ...] = ()


class Package:
    """The modules of a package on disk, by dotted name, and the imports between them."""

    def __init__(self, name: str, root: Path) -> None:
        self.name = name
        self.modules: dict[str, Path] = {}
        for path in sorted(root.rglob("*.py")):
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            self.modules[".".join((name, *parts))] = path

    def imports(self, module: str) -> Iterator[Import]:
        """Every import `module` can run, relative ones resolved; `from p import m` names the
        module `p.m` when there is one."""
        path = self.modules[module]
        here = module if path.name == "__init__.py" else module.rpartition(".")[0]
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    yield Import(alias.name, node.lineno)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = here.split(".")[: len(here.split(".")) - (node.level - 1)]
                    base = ".".join([*anchor, *([base] if base else [])])
                names = tuple(alias.name for alias in node.names)
                yield Import(base, node.lineno, names)
            elif (
                isinstance(node, ast.Call)
                and _called(node.func) in ("lazy_import", "import_module")
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                yield Import(node.args[0].value, node.lineno)

    def runs(self, importer: str, found: Import) -> set[str]:
        """The modules of the package that `found` needs to have run.

        Importing `a.b.c` runs `a.b` and `a.b.c`; the packages `importer` is inside are running
        already, and `from a.b import m` of a module `m` asks nothing of `a.b`'s own code. But
        `from a.b import name` of a name needs `a.b` to have defined it, wherever it is asked.
        """
        modules = {f"{found.module}.{n}" for n in found.names} & self.modules.keys()
        needs_names = len(modules) < len(found.names)
        needed = set()
        for target in modules or {found.module}:
            parts = target.split(".")
            for end in range(1, len(parts) + 1):
                name = ".".join(parts[:end])
                inside = importer == name or importer.startswith(name + ".")
                if name in self.modules and not inside:
                    needed.add(name)
        if needs_names and found.module in self.modules and found.module != importer:
            needed.add(found.module)
        return needed

    def graph(self) -> dict[str, dict[str, int]]:
        """Each module -> the modules of the package it needs run, each with a line."""
        graph: dict[str, dict[str, int]] = {}
        for module in self.modules:
            edges: dict[str, int] = {}
            for found in self.imports(module):
                for name in self.runs(module, found):
                    edges.setdefault(name, found.line)
            graph[module] = edges
        return graph


def _called(func: ast.expr) -> str | None:
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return None


SGLPATCH = Package(PACKAGE, ROOT)
MODULES = SGLPATCH.modules


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle per strongly connected component with more than one module (or a self-import),
    found by Tarjan's algorithm; each cycle is a path through the component back to its start."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in graph[node]:
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1 or node in graph[node]:
                components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return [_cycle_in(graph, set(c), c[0]) for c in sorted(components)]


def _cycle_in(graph: dict[str, dict[str, int]], component: set[str], start: str) -> list[str]:
    """The shortest path from `start` back to itself inside `component` (breadth first)."""
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for node in frontier:
            for succ in sorted(graph[node]):
                if succ not in component:
                    continue
                if succ == start:
                    path = [node]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if succ not in came_from:
                    came_from[succ] = node
                    following.append(succ)
        frontier = following
    raise AssertionError(f"{start} is in a cycle with no way back")


def _shown(graph: dict[str, dict[str, int]], cycle: list[str]) -> str:
    steps = [f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)]
    return " -> ".join([*steps, cycle[-1]])


def test_the_graph_sees_every_kind_of_import(tmp_path: Path) -> None:
    """The reader itself, on a small package: every way of importing, and what each runs."""
    files = {
        "__init__.py": "",
        "low.py": "",
        "lazy_user.py": "from pkg.lazy import lazy_import\nx = lazy_import('pkg.low')\n",
        "typed.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import pkg.low\n",
        "late.py": "def f():\n    from pkg import low\n    return low\n",
        "sub/__init__.py": "from . import a\nNAME = 1\n",
        "sub/a.py": "from .. import low\nfrom . import b\n",
        "sub/b.py": "",
        "sub/c.py": "from pkg.sub import NAME\n",
        "user.py": "import pkg.sub.b\n",
    }
    for name, text in files.items():
        (tmp_path / "pkg" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pkg" / name).write_text(text)
    graph = Package("pkg", tmp_path / "pkg").graph()
    assert graph["pkg.lazy_user"] == {"pkg.low": 2}  # named to lazy_import (pkg.lazy: not ours)
    assert graph["pkg.typed"] == {"pkg.low": 3}  # under TYPE_CHECKING
    assert graph["pkg.late"] == {"pkg.low": 2}  # inside a function
    assert graph["pkg.sub"] == {"pkg.sub.a": 1}  # `from . import a`: the module
    assert graph["pkg.sub.a"] == {"pkg.low": 1, "pkg.sub.b": 2}  # its package runs already
    assert graph["pkg.sub.c"] == {"pkg.sub": 1}  # a name: the package's own code must run
    assert graph["pkg.user"] == {"pkg.sub": 1, "pkg.sub.b": 1}  # the package runs first
    assert _cycles(graph) == []
    (tmp_path / "pkg" / "sub" / "__init__.py").write_text("from .c import *\nNAME = 1\n")
    graph = Package("pkg", tmp_path / "pkg").graph()
    assert _cycles(graph) == [["pkg.sub", "pkg.sub.c", "pkg.sub"]]
    assert _shown(graph, ["pkg.sub", "pkg.sub.c", "pkg.sub"]) == (
        "pkg.sub (line 1) -> pkg.sub.c (line 1) -> pkg.sub"
    )


def test_cycles_are_found_and_named() -> None:
    cycle = {"a": {"b": 1}, "b": {"c": 2}, "c": {"a": 3, "b": 5}, "d": {"a": 4}}
    assert _cycles(cycle) == [["a", "b", "c", "a"]]
    assert _cycles({"a": {"a": 1}}) == [["a", "a"]]
    assert _cycles({"a": {"b": 1}, "b": {}}) == []


def _in_doctor(module: str) -> bool:
    return module.startswith(f"{PACKAGE}.doctor") or module == f"{PACKAGE}.api.doctor"


@pytest.mark.parametrize("where", ["outside doctor", "doctor"])
def test_no_import_cycle(where: str) -> None:
    """A cycle (even a lazy one) means two modules each need the other: one layer too few.

    Cycles through `doctor/` and `api/doctor.py` are reported apart: that wing is being
    restructured on its own.
    """
    graph = SGLPATCH.graph()
    cycles = [c for c in _cycles(graph) if any(_in_doctor(m) for m in c) == (where == "doctor")]
    assert not cycles, "import cycles:\n" + "\n".join(_shown(graph, c) for c in cycles)


def _api_modules() -> list[str]:
    return sorted(m for m in MODULES if m.startswith(f"{PACKAGE}.api."))


def test_the_ledgers_public_face_is_what_the_store_exports() -> None:
    """Widening it (the journal, a record's paths) is a decision: made here, not in passing."""
    import sglpatch.store

    assert set(sglpatch.store.__all__) == STORE_API


@pytest.mark.parametrize("module", _api_modules())
def test_api_uses_only_the_ledgers_public_face(module: str) -> None:
    """`api/` asks the ledger to record a change; how and where it is written is `store/`'s."""
    wrong = []
    for found in SGLPATCH.imports(module):
        if found.module.startswith(f"{PACKAGE}.store."):
            wrong.append(f"line {found.line}: imports {found.module}")
        elif found.module == f"{PACKAGE}.store":
            wrong += [f"line {found.line}: {n}" for n in found.names if n not in STORE_API]
    tree = ast.parse(MODULES[module].read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in ("repository", "stored", "journal"):
            wrong.append(f"line {node.lineno}: reaches into the record (.{node.attr})")
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            said = [part for part in LEDGER_LAYOUT if part in node.value]
            wrong += [f"line {node.lineno}: names the ledger's {part!r}" for part in said]
    assert not wrong, f"{module} knows the ledger's insides:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith(f"{PACKAGE}.cli")))
def test_cli_imports_no_libcst_and_no_git(module: str) -> None:
    """The terminal's side parses, calls the API and prints: the engine's libraries stay below."""
    wrong = [
        f"line {found.line}: {found.module}"
        for found in SGLPATCH.imports(module)
        if found.module.split(".")[0] in ("libcst", "git")
        or found.module in (f"{PACKAGE}.cst_tools", f"{PACKAGE}.store.git")
    ]
    assert not wrong, f"{module} imports below the API:\n" + "\n".join(wrong)


@pytest.mark.parametrize("module", sorted(m for m in MODULES if not _in_doctor(m)))
def test_doctor_has_one_door(module: str) -> None:
    """Outside `doctor/`, doctor is `sglpatch.doctor` and nothing below it, and nobody else builds
    or edits its answer: a Diagnosis is made (or `_replace`d) inside doctor only."""
    wrong = [
        f"line {found.line}: imports {found.module}"
        for found in SGLPATCH.imports(module)
        if found.module.startswith(f"{PACKAGE}.doctor.")
        or (
            found.module == f"{PACKAGE}.doctor"
            and any(f"{PACKAGE}.doctor.{name}" in MODULES for name in found.names)
        )
    ]
    for node in ast.walk(ast.parse(MODULES[module].read_text())):
        if isinstance(node, ast.Call):
            called = node.func
            name = called.attr if isinstance(called, ast.Attribute) else getattr(called, "id", "")
            if name in ("Diagnosis", "Blocker", "Suspect"):
                wrong.append(f"line {node.lineno}: builds a {name}")
    assert not wrong, f"{module} reaches behind doctor's door:\n" + "\n".join(wrong)


def test_the_apis_doctor_finds_the_target_and_asks_the_door() -> None:
    """`api/doctor.py` finds the target and calls `sglpatch.doctor.diagnose`: nothing else."""
    module = f"{PACKAGE}.api.doctor"
    assert len(MODULES[module].read_text().splitlines()) <= 80
    imported = {
        f"{found.module}.{name}" if f"{found.module}.{name}" in MODULES else found.module
        for found in SGLPATCH.imports(module)
        for name in found.names or ("",)
        if found.module.startswith(PACKAGE)
    }
    # the door, and what every API module shares: the target finder and the report values
    assert imported <= {f"{PACKAGE}.doctor", f"{PACKAGE}.target", f"{PACKAGE}.reports"}, imported
    assert f"{PACKAGE}.doctor" in imported


def test_no_module_is_over_400_lines() -> None:
    """The house rule: a module that grows past 400 lines is split by what it does."""
    long = {
        str(path.relative_to(ROOT.parent)): count
        for path in sorted([*ROOT.rglob("*.py"), *(ROOT.parent / "patches").rglob("*.py")])
        if (count := len(path.read_text().splitlines())) > 400
    }
    assert not long, long
