"""Finding the code a patch edits in a LibCST tree, or learning what the tree already holds.

Each finder raises `AnchorMissing` instead of guessing when the code is not in the expected shape.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TypeVar

import libcst as cst

from sglpatch.cst_tools.walking import _simple_statements, _walk, find_compound
from sglpatch.patch_errors import AnchorMissing

D = TypeVar("D", cst.ClassDef, cst.FunctionDef)


def find_class(module: cst.Module, name: str) -> cst.ClassDef:
    return _one_named(module, cst.ClassDef, name, "class")


def class_body(node: cst.ClassDef) -> Sequence[cst.BaseStatement]:
    return _indented(node, "class")


def _one_named(module: cst.Module, kind: type[D], name: str, what: str) -> D:
    """The module-level `kind` (a class or a function) called `name`, defined exactly once."""
    found = [s for s in module.body if isinstance(s, kind) and s.name.value == name]
    if len(found) != 1:
        raise AnchorMissing(f"expected one {what} {name}, found {len(found)}")
    return found[0]


def _indented(node: cst.ClassDef | cst.FunctionDef, what: str) -> Sequence[cst.BaseStatement]:
    if not isinstance(node.body, cst.IndentedBlock):
        raise AnchorMissing(f"{what} {node.name.value} has no indented body")
    return node.body.body


def find_dict(body: Sequence[cst.BaseStatement], name: str) -> cst.Dict:
    """The dict literal assigned to `name` in a module or class body, assigned exactly once."""
    values: list[cst.BaseExpression] = []
    for statement in body:
        if not isinstance(statement, cst.SimpleStatementLine):
            continue
        for small in statement.body:
            if (
                isinstance(small, cst.Assign)
                and any(
                    isinstance(t.target, cst.Name) and t.target.value == name for t in small.targets
                )
            ) or (
                isinstance(small, cst.AnnAssign)
                and isinstance(small.target, cst.Name)
                and small.target.value == name
                and small.value is not None
            ):
                values.append(small.value)  # type: ignore[arg-type]  # narrowed by the test above
    if len(values) != 1:
        raise AnchorMissing(f"expected one assignment to {name}, found {len(values)}")
    if not isinstance(values[0], cst.Dict):
        raise AnchorMissing(f"{name} is not a dict literal")
    return values[0]


def int_key(element: cst.BaseDictElement) -> int | None:
    if isinstance(element, cst.DictElement) and isinstance(element.key, cst.Integer):
        value = element.key.evaluated_value
        return value if isinstance(value, int) else None
    return None


def dict_row(table: cst.Dict, key: int) -> cst.DictElement | None:
    rows = [e for e in table.elements if int_key(e) == key]
    if len(rows) > 1:
        raise AnchorMissing(f"key {key} appears {len(rows)} times")
    row = rows[0] if rows else None
    return row if isinstance(row, cst.DictElement) else None


def method_names(node: cst.ClassDef) -> set[str]:
    return set(methods(node))


def methods(node: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in class_body(node) if isinstance(s, cst.FunctionDef)}


def find_function(module: cst.Module, name: str) -> cst.FunctionDef:
    """The module-level function `name`, defined exactly once."""
    return _one_named(module, cst.FunctionDef, name, "function")


def function_body(node: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    return _indented(node, "function")


def ifs_testing(module: cst.Module, node: cst.CSTNode, test: str) -> list[cst.If]:
    """`if`/`elif` statements under `node` whose condition contains the source text `test`
    (looked for through blocks alone: a statement lies in no expression)."""
    return [i for i in find_compound(node, cst.If) if test in module.code_for_node(i.test)]


def assigns_self_attribute(node: cst.CSTNode, attribute: str) -> bool:
    """Whether a statement under `node` assigns `self.<attribute>` (also inside a tuple)."""
    targets: list[cst.CSTNode] = []
    for line in _simple_statements(node):
        for small in line.body:
            if isinstance(small, cst.Assign):
                targets.extend(t.target for t in small.targets)
            elif isinstance(small, cst.AnnAssign):
                targets.append(small.target)
    return any(
        isinstance(a.value, cst.Name) and a.value.value == "self" and a.attr.value == attribute
        for target in targets
        for a in _walk(target, cst.Attribute)
    )


def method_calls_on(node: cst.CSTNode, owner: str, method: str) -> list[cst.Call]:
    """Calls `<...>.<owner>.<method>(...)`, e.g. `self._WORLD_SIZES_MULTIMEM.get(...)`."""
    return [
        call
        for call in _walk(node, cst.Call)
        if isinstance(call.func, cst.Attribute)
        and call.func.attr.value == method
        and isinstance(call.func.value, cst.Attribute)
        and call.func.value.attr.value == owner
    ]


def if_chain(head: cst.If) -> list[cst.If]:
    """The branches of `if ...: elif ...: elif ...:`, head first."""
    branches = [head]
    while isinstance(branches[-1].orelse, cst.If):
        branches.append(branches[-1].orelse)
    return branches


def if_chains(scope: cst.CSTNode) -> list[list[cst.If]]:
    """Every `if`/`elif` chain under `scope`, each once: its branches, head first (an `elif` is
    part of its chain, never a head of its own)."""
    found = find_compound(scope, cst.If)
    elifs = {id(b.orelse) for b in found if isinstance(b.orelse, cst.If)}
    return [if_chain(head) for head in found if id(head) not in elifs]


def imported_names(module: cst.Module, source: str | None = None) -> list[str]:
    """Names imported by top-level `from <source> import ...` statements (no star imports);
    without `source`, by every top-level `from ... import`, relative ones too."""
    return [
        alias.evaluated_name
        for statement in _from_imports(module, source)
        if not isinstance(statement.names, cst.ImportStar)
        for alias in statement.names
    ]


def _from_imports(module: cst.Module, source: str | None) -> list[cst.ImportFrom]:
    found: list[cst.ImportFrom] = []
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if isinstance(small, cst.ImportFrom) and (
                source is None
                or (
                    small.module is not None
                    and not small.relative
                    and _dotted(small.module) == source
                )
            ):
                found.append(small)
    return found


def _dotted(node: cst.BaseExpression) -> str | None:
    if isinstance(node, cst.Name):
        return node.value
    if isinstance(node, cst.Attribute):
        head = _dotted(node.value)
        return None if head is None else f"{head}.{node.attr.value}"
    return None
