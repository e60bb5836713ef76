"""Tables keyed by compute-capability majors that know 10 but not 12.

A table without a row for 10 fails on 10 as it does on 12: no gap of 12's own, so not reported.

A table read with a subscript gives capability 12 a `KeyError: 12`; one only ever read with
`.get(major)` or tested with `major in TABLE` first takes an unknown major in its stride and is
not reported. A table its own module never reads (`all_reduce_utils.py`'s, imported by
`torch_symm_mem.py`) is judged by the reads of the modules beside it (`beside`).
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Sequence
from pathlib import Path

from sglpatch.doctor.findings import Finding, Kind
from sglpatch.doctor.read.source_tree import chain, every_node, read_file

MAJORS = frozenset(range(7, 14))  # plausible compute-capability majors
KNOWN = 10
NEW = 12


def tables(tree: ast.Module, shown: str, lines: Sequence[str]) -> list[Finding]:
    tables: list[tuple[int, set[str]]] = []
    nodes = list(every_node(tree))  # one walk for the tables and their reads
    for node in nodes:
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and isinstance(node.value, ast.Dict):
            keys = _int_keys(node.value)
            if keys and keys <= MAJORS and KNOWN in keys and NEW not in keys:
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                tables.append((node.lineno, {c[-1] for t in targets if (c := chain(t))}))
    if not tables:
        return []
    # A table only ever read with `.get(key, default)` takes an unknown major in its stride.
    subscripted, tolerant = _reads(nodes)
    found = []
    for line, names in tables:
        if names & subscripted:
            code = lines[line - 1].strip() if line <= len(lines) else ""
            found.append(Finding(shown, line, Kind.TABLE, code, "KeyError: 12", "its row"))
        elif not names & tolerant:
            code = lines[line - 1].strip() if line <= len(lines) else ""
            found.append(Finding(shown, line, Kind.TABLE, code, "no row", "its row"))
    return found


def _reads(nodes: Iterable[ast.AST]) -> tuple[set[str], set[str]]:
    """Of a module's `nodes`, the names read with a subscript, and those only read in a way
    that tolerates a missing key (`.get(key)`, `.get(key, default)`, `key in table`)."""
    subscripted: set[str] = set()
    tolerant: set[str] = set()
    for node in nodes:
        if isinstance(node, ast.Subscript) and isinstance(node.ctx, ast.Load):
            if names := chain(node.value):
                subscripted.add(names[-1])
        elif isinstance(node, ast.Call):
            func = node.func
            if (
                isinstance(func, ast.Attribute)
                and func.attr == "get"
                and 1 <= len(node.args) <= 2
                and (names := chain(func.value))
            ):
                tolerant.add(names[-1])
        elif isinstance(node, ast.Compare):
            for op, right in zip(node.ops, node.comparators, strict=False):
                if isinstance(op, (ast.In, ast.NotIn)) and (names := chain(right)):
                    tolerant.add(names[-1])
    return subscripted, tolerant - subscripted


def beside(finding: Finding, package_dir: Path) -> Finding | None:
    """A table its own module never reads (`no row`), judged by the reads in the `.py` files of
    its folder that name it: `KeyError: 12` where one subscripts it, None (not reported) where
    they only read it tolerantly; the finding as it is when none reads it."""
    if finding.kind is not Kind.TABLE or finding.gets != "no row":
        return finding
    folder = package_dir / Path(finding.file).relative_to("sglang").parent
    name = _defined_name(finding.code)
    if name is None:
        return finding
    subscripted = tolerant = False
    for path in sorted(folder.glob("*.py")):
        data, _ = read_file(path)
        if data is None or path.name == Path(finding.file).name or name.encode() not in data:
            continue
        try:
            tree = ast.parse(data)
        except (SyntaxError, ValueError, RecursionError, MemoryError):
            continue
        strict, lenient = _reads(every_node(tree))
        subscripted |= name in strict
        tolerant |= name in lenient
    if subscripted:
        return finding._replace(gets="KeyError: 12")
    return None if tolerant else finding


def _defined_name(code: str) -> str | None:
    """`NAME = {` or `NAME: dict[...] = {`: the table's name."""
    head = code.split("=", 1)[0].split(":", 1)[0].strip()
    return head if head.isidentifier() else None


def _int_keys(node: ast.Dict) -> set[int] | None:
    keys = set()
    for key in node.keys:
        if not (isinstance(key, ast.Constant) and type(key.value) is int):
            return None
        keys.add(key.value)
    return keys
