"""Small, exact edits on LibCST trees, shared by the patch modules.

Each finder raises `AnchorMissing` instead of guessing when the code is not in the expected shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Sequence
from typing import TypeGuard, TypeVar

import libcst as cst

from sglpatch.patch import AnchorMissing

T = TypeVar("T", bound=cst.CSTNode)


def find_class(module: cst.Module, name: str) -> cst.ClassDef:
    found = [s for s in module.body if isinstance(s, cst.ClassDef) and s.name.value == name]
    if len(found) != 1:
        raise AnchorMissing(f"expected one class {name}, found {len(found)}")
    return found[0]


def class_body(node: cst.ClassDef) -> Sequence[cst.BaseStatement]:
    if not isinstance(node.body, cst.IndentedBlock):
        raise AnchorMissing(f"class {node.name.value} has no indented body")
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


def with_row_after(table: cst.Dict, anchor_key: int, row: cst.DictElement) -> cst.Dict:
    """Insert `row` right after the `anchor_key` row, laid out like the rows around it.

    The new row copies the anchor's comma and line break (so a trailing comma stays trailing),
    while an end-of-line comment stays on the anchor's line. If the anchor was last, it now
    breaks to the new row the way its neighbours break to theirs.
    """
    elements = list(table.elements)
    index = next(i for i, e in enumerate(elements) if int_key(e) == anchor_key)
    anchor = elements[index]
    new_row = row.with_changes(comma=_without_comment(anchor.comma))
    if index < len(elements) - 1:
        elements.insert(index + 1, new_row)
        return table.with_changes(elements=elements)
    # The last row's line break and comment belong to the closing brace.
    closing = table.rbrace.whitespace_before
    separator = _separator(table, elements, index)
    if isinstance(closing, cst.ParenthesizedWhitespace):
        separator = _with_first_line(separator, closing.first_line)
        closing = closing.with_changes(first_line=cst.TrailingWhitespace())
    elements[index] = anchor.with_changes(comma=separator)
    elements.insert(index + 1, new_row)
    return table.with_changes(
        elements=elements, rbrace=table.rbrace.with_changes(whitespace_before=closing)
    )


def _separator(table: cst.Dict, elements: list[cst.BaseDictElement], index: int) -> cst.Comma:
    previous = elements[index - 1].comma if index > 0 else None
    if isinstance(previous, cst.Comma):
        return _without_comment(previous.deep_clone())  # type: ignore[return-value]
    # A lone row: break the line the way the opening brace does.
    return cst.Comma(whitespace_after=table.lbrace.whitespace_after.deep_clone())


def _without_comment(comma: cst.Comma | cst.MaybeSentinel) -> cst.Comma | cst.MaybeSentinel:
    if isinstance(comma, cst.Comma):
        return _with_first_line(comma, cst.TrailingWhitespace())
    return comma


def _with_first_line(comma: cst.Comma, line: cst.TrailingWhitespace) -> cst.Comma:
    after = comma.whitespace_after
    if isinstance(after, cst.ParenthesizedWhitespace):
        return comma.with_changes(whitespace_after=after.with_changes(first_line=line))
    return comma


def replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """`module` with the node `old` (by identity) swapped for `new`.

    Only the nodes on the path from the module down to `old` are rebuilt, which is much cheaper
    than `deep_replace` visiting the whole tree.
    """
    for position, statement in enumerate(module.body):  # most anchors are top-level statements
        if statement is old:
            body = (*module.body[:position], new, *module.body[position + 1 :])
            return module.with_changes(body=body)
    path = _path_to(module, old)
    if path is None:
        raise AnchorMissing("the node to replace is not in the module")
    replacement: cst.CSTNode = new
    for parent, field, index in reversed(path):
        value = getattr(parent, field)
        if index is not None:
            value = type(value)((*value[:index], replacement, *value[index + 1 :]))
        else:
            value = replacement
        replacement = parent.with_changes(**{field: value})
    if not isinstance(replacement, cst.Module):  # a path that does not start at the module
        raise AnchorMissing("the replaced node is not inside the module")
    return replacement


Step = tuple[cst.CSTNode, str, "int | None"]


def _path_to(root: cst.CSTNode, target: cst.CSTNode) -> list[Step] | None:
    """The (parent, field, index) steps from `root` down to `target`, searched in source order
    (anchors sit near the top of their files) with parent links instead of copied paths."""
    parents: dict[int, tuple[cst.CSTNode, Step]] = {}
    stack: list[cst.CSTNode] = [root]
    while stack:
        node = stack.pop()
        if node is target:
            path: list[Step] = []
            while id(node) in parents:
                node, step = parents[id(node)]
                path.append(step)
            return path[::-1]
        children: list[cst.CSTNode] = []
        for field, value in _fields(node):
            if isinstance(value, cst.CSTNode):
                parents[id(value)] = (node, (node, field, None))
                children.append(value)
            elif isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    if isinstance(item, cst.CSTNode):
                        parents[id(item)] = (node, (node, field, index))
                        children.append(item)
        stack.extend(reversed(children))
    return None


def method_names(node: cst.ClassDef) -> set[str]:
    return set(methods(node))


def methods(node: cst.ClassDef) -> dict[str, cst.FunctionDef]:
    return {s.name.value: s for s in class_body(node) if isinstance(s, cst.FunctionDef)}


def find_function(module: cst.Module, name: str) -> cst.FunctionDef:
    """The module-level function `name`, defined exactly once."""
    found = [s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == name]
    if len(found) != 1:
        raise AnchorMissing(f"expected one function {name}, found {len(found)}")
    return found[0]


def ifs_testing(module: cst.Module, node: cst.CSTNode, test: str) -> list[cst.If]:
    """`if`/`elif` statements under `node` whose condition contains the source text `test`."""
    return [i for i in _walk(node, cst.If) if test in module.code_for_node(i.test)]


def append_to_class(node: cst.ClassDef, statements: Sequence[cst.BaseStatement]) -> cst.ClassDef:
    if not isinstance(node.body, cst.IndentedBlock):  # `class X: pass` on one line
        raise AnchorMissing(f"class {node.name.value} has no indented body to add to")
    return node.with_changes(body=node.body.with_changes(body=[*node.body.body, *statements]))


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


_HANDLERS = (cst.ExceptHandler, cst.ExceptStarHandler, cst.MatchCase)


def _simple_statements(
    node: cst.CSTNode,
) -> Iterator[cst.SimpleStatementLine | cst.SimpleStatementSuite]:
    """Simple statements at any depth of blocks, without descending into expressions."""
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, (cst.SimpleStatementLine, cst.SimpleStatementSuite)):
            yield current
        elif isinstance(current, (cst.BaseCompoundStatement, cst.BaseSuite)):
            for _, value in _fields(current):
                if isinstance(value, (cst.BaseSuite, cst.BaseStatement, cst.BaseCompoundStatement)):
                    stack.append(value)
                elif isinstance(value, (cst.Else, cst.Finally)):
                    stack.append(value.body)
                elif isinstance(value, (list, tuple)):
                    for item in value:
                        if isinstance(item, cst.BaseStatement):
                            stack.append(item)
                        elif isinstance(item, _HANDLERS):
                            stack.append(item.body)


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


_FIELD_NAMES: dict[type, tuple[str, ...]] = {}


def _fields(node: cst.CSTNode) -> list[tuple[str, object]]:
    names = _FIELD_NAMES.get(type(node))
    if names is None:  # nodes use __slots__, so vars() does not work; fields() is slow: cache
        names = _FIELD_NAMES[type(node)] = tuple(f.name for f in dataclasses.fields(node))
    return [(name, getattr(node, name)) for name in names]


def _walk(node: cst.CSTNode, kind: type[T] | tuple[type[T], ...]) -> Iterator[T]:
    """Every node of type `kind` under `node`.

    Reads the dataclass fields directly: `CSTNode.children` runs a visitor per node and made
    a walk over a large class cost a quarter of a second.
    """
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, kind):
            yield current
        for _, value in _fields(current):
            if isinstance(value, cst.CSTNode):
                stack.append(value)
            elif value.__class__ in (list, tuple):
                stack.extend(item for item in value if isinstance(item, cst.CSTNode))


def statement(code: str, module: cst.Module) -> cst.BaseStatement:
    """Parse new code with the module's own indentation and line endings."""
    return cst.parse_statement(code, config=module.config_for_parsing)


def function_body(node: cst.FunctionDef) -> Sequence[cst.BaseStatement]:
    if not isinstance(node.body, cst.IndentedBlock):
        raise AnchorMissing(f"function {node.name.value} has no indented body")
    return node.body.body


def with_statements_beside(
    node: cst.FunctionDef,
    anchor: cst.BaseStatement,
    statements: Sequence[cst.BaseStatement],
    *,
    after: bool,
) -> cst.FunctionDef:
    """`node` with `statements` inserted right before or after its top-level statement `anchor`.

    Each statement keeps its own leading lines (blank lines, comments); the anchor keeps its own.
    """
    body = list(function_body(node))
    index = next((i for i, s in enumerate(body) if s is anchor), None)
    if index is None:
        raise AnchorMissing(f"the anchor is not a statement of {node.name.value}")
    at = index + 1 if after else index
    body[at:at] = statements
    if not isinstance(node.body, cst.IndentedBlock):  # function_body has refused it already
        raise AnchorMissing(f"function {node.name.value} has no indented body")
    return node.with_changes(body=node.body.with_changes(body=body))


def imported_names(module: cst.Module, source: str) -> list[str]:
    """Names imported by top-level `from <source> import ...` statements (no star imports)."""
    return [
        alias.evaluated_name
        for statement in _from_imports(module, source)
        if not isinstance(statement.names, cst.ImportStar)
        for alias in statement.names
    ]


def with_imported_name(
    module: cst.Module, source: str, name: str, after: Sequence[str]
) -> cst.Module:
    """`module` whose first `from <source> import (...)` also imports `name`.

    `name` goes right after the last of `after` that the statement imports (keeping an isort-
    ordered list ordered), or at the end; it copies its neighbour's comma and line break.
    """
    if name in imported_names(module, source):
        return module
    statements = [
        s for s in _from_imports(module, source) if not isinstance(s.names, cst.ImportStar)
    ]
    if not statements:
        raise AnchorMissing(f"no `from {source} import ...` to add {name} to")
    statement = statements[0]
    names = list(statement.names)  # type: ignore[arg-type]  # not a star import, checked above
    position = max(
        (i for i, alias in enumerate(names) if alias.evaluated_name in after),
        default=len(names) - 1,
    )
    neighbour = names[position]
    new = cst.ImportAlias(name=cst.Name(name), comma=neighbour.comma)
    if position == len(names) - 1:
        # The last name's comma leads to the closing parenthesis: the new last name takes it,
        # and the old one takes the separator its predecessor uses between names.
        separator = names[position - 1].comma if position else cst.MaybeSentinel.DEFAULT
        if not isinstance(separator, cst.Comma):
            separator = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
        names[position] = neighbour.with_changes(comma=separator)
    names.insert(position + 1, new)
    return replace(module, statement, statement.with_changes(names=names))


def _from_imports(module: cst.Module, source: str) -> list[cst.ImportFrom]:
    found: list[cst.ImportFrom] = []
    for line in module.body:
        if not isinstance(line, cst.SimpleStatementLine):
            continue
        for small in line.body:
            if (
                isinstance(small, cst.ImportFrom)
                and small.module is not None
                and not small.relative
                and _dotted(small.module) == source
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


def walk(node: cst.CSTNode, kind: type[T]) -> Iterator[T]:
    """Every node of type `kind` under `node` (public form of `_walk`)."""
    return _walk(node, kind)


_BLOCK_PARTS = (cst.BaseSuite, cst.BaseStatement, cst.Else, cst.Finally, *_HANDLERS)
_IS_BLOCK_PART: dict[type, bool] = {}


def _block_part(value: object) -> TypeGuard[cst.CSTNode]:
    """Whether `value` is a block or a statement that may hold blocks (not a simple line).

    Memoised per class: `isinstance` against libcst's abstract bases is slow in a hot loop.
    """
    cls = value.__class__
    known = _IS_BLOCK_PART.get(cls)
    if known is None:
        known = _IS_BLOCK_PART[cls] = issubclass(cls, _BLOCK_PARTS) and not issubclass(
            cls, (cst.SimpleStatementLine, cst.SimpleStatementSuite)
        )
    return known


def find_compound(node: cst.CSTNode, kind: type[T]) -> list[T]:
    """Every compound statement (`if`, `def`, `with`, ...) of type `kind` under `node`.

    Descends through blocks only, never into expressions, so it is much cheaper than
    `walk` on a large module.
    """
    found: list[T] = []
    stack: list[cst.CSTNode] = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, kind):
            found.append(current)
        for _, value in _fields(current):
            if _block_part(value):
                stack.append(value)
            elif value.__class__ in (list, tuple):
                stack.extend(item for item in value if _block_part(item))
    return found


def if_chain(head: cst.If) -> list[cst.If]:
    """The branches of `if ...: elif ...: elif ...:`, head first."""
    branches = [head]
    while isinstance(branches[-1].orelse, cst.If):
        branches.append(branches[-1].orelse)
    return branches


def with_branch_before(head: cst.If, index: int, branch: cst.If) -> cst.If:
    """The chain starting at `head` with `branch` inserted as branch number `index`.

    Comments above the old head stay above the chain, which `branch` may now start.
    """
    branches = if_chain(head)
    tail = branches[-1].orelse
    ordered = [*branches[:index], branch.with_changes(leading_lines=()), *branches[index:]]
    ordered[index + 1] = ordered[index + 1].with_changes(leading_lines=())
    rebuilt: cst.If | cst.Else | None = tail
    for node in reversed(ordered[1:]):
        rebuilt = node.with_changes(orelse=rebuilt)
    return ordered[0].with_changes(orelse=rebuilt, leading_lines=head.leading_lines)


def with_alias(node: cst.ImportFrom, name: str) -> cst.ImportFrom:
    """`from x import a, b` -> `from x import a, b, name`, laid out like the names before it."""
    if isinstance(node.names, cst.ImportStar):
        raise AnchorMissing("cannot add a name to `import *`")
    names = list(node.names)
    last = names[-1]
    if isinstance(last.comma, cst.Comma):  # a trailing comma: the new name keeps it
        new = cst.ImportAlias(cst.Name(name), comma=last.comma)
        between = names[-2].comma if len(names) > 1 else last.comma
    else:
        new = cst.ImportAlias(cst.Name(name))
        between = names[-2].comma if len(names) > 1 else cst.Comma(cst.SimpleWhitespace(""))
    if not isinstance(between, cst.Comma):
        between = cst.Comma(whitespace_after=cst.SimpleWhitespace(" "))
    names[-1] = last.with_changes(comma=between)
    return node.with_changes(names=[*names, new])


def replace_statement(
    module: cst.Module, old: cst.BaseStatement, new: cst.BaseStatement
) -> cst.Module:
    """`replace` for a statement: the search for `old` descends through blocks only.

    On a file the size of server_args.py this is several times cheaper than `replace`.
    """
    parents: dict[int, tuple[cst.CSTNode, str, int | None]] = {}
    stack: list[cst.CSTNode] = [module]
    while stack:
        current = stack.pop()
        if current is old:
            break
        for field, value in _fields(current):
            if _block_part(value) or (value is old and isinstance(value, cst.CSTNode)):
                parents[id(value)] = (current, field, None)
                stack.append(value)
            elif value.__class__ in (list, tuple):
                for position, item in enumerate(value):
                    if _block_part(item) or (item is old and isinstance(item, cst.CSTNode)):
                        parents[id(item)] = (current, field, position)
                        stack.append(item)
    else:
        raise AnchorMissing("the statement to replace is not in the module")
    replacement: cst.CSTNode = new
    node: cst.CSTNode = old
    while id(node) in parents:
        parent, field, index = parents[id(node)]
        value = getattr(parent, field)
        if index is not None:
            value = type(value)((*value[:index], replacement, *value[index + 1 :]))
        else:
            value = replacement
        replacement = parent.with_changes(**{field: value})
        node = parent
    if not isinstance(replacement, cst.Module):  # `old` is a statement: the root is the module
        raise AnchorMissing("the statement to replace is not in the module")
    return replacement
