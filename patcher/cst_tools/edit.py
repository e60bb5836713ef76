"""Exact edits on LibCST trees: each returns a changed copy, laid out like the code around it.

An edit whose anchor is not where it should be raises `AnchorMissing`; none guesses.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import libcst as cst

from sglpatch.cst_tools.find import _from_imports, function_body, if_chain, imported_names, int_key
from sglpatch.cst_tools.walking import _path_to
from sglpatch.patch_errors import AnchorMissing


def replace(module: cst.Module, old: cst.CSTNode, new: cst.CSTNode) -> cst.Module:
    """`module` with the node `old` (by identity) swapped for `new`.

    Only the nodes on the path from the module down to `old` are rebuilt, which is much cheaper
    than `deep_replace` visiting the whole tree; a statement is looked for through blocks alone.
    """
    for position, statement in enumerate(module.body):  # most anchors are top-level statements
        if statement is old:
            body = (*module.body[:position], new, *module.body[position + 1 :])
            return module.with_changes(body=body)
    path = _path_to(module, old, blocks_only=isinstance(old, cst.BaseStatement))
    if path is None:
        raise AnchorMissing("the node to replace is not in the module")
    # a path that does not start at the module leaves something else at the top
    return _rebuilt(reversed(path), new, "the replaced node is not inside the module")


def _rebuilt(
    steps: Iterable[tuple[cst.CSTNode, str, int | None]], new: cst.CSTNode, outside: str
) -> cst.Module:
    """The tree with `new` in place, rebuilt up `steps` (parent, field, index in it), from the
    replaced node's parent to the module; raise with `outside` if that is not where they end."""
    replacement: cst.CSTNode = new
    for parent, field, index in steps:
        value = getattr(parent, field)
        if index is not None:
            value = type(value)((*value[:index], replacement, *value[index + 1 :]))
        else:
            value = replacement
        replacement = parent.with_changes(**{field: value})
    if not isinstance(replacement, cst.Module):
        raise AnchorMissing(outside)
    return replacement


def replace_statement(
    module: cst.Module, old: cst.BaseStatement, new: cst.BaseStatement
) -> cst.Module:
    """`replace` for a statement: the search for `old` descends through blocks only.

    On a file the size of server_args.py this is several times cheaper than a search of every
    node; `replace` does it too for a statement.
    """
    path = _path_to(module, old, blocks_only=True)
    if path is None:
        raise AnchorMissing("the statement to replace is not in the module")
    # `old` is a statement: the root is the module
    return _rebuilt(reversed(path), new, "the statement to replace is not in the module")


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


def append_to_class(node: cst.ClassDef, statements: Sequence[cst.BaseStatement]) -> cst.ClassDef:
    if not isinstance(node.body, cst.IndentedBlock):  # `class X: pass` on one line
        raise AnchorMissing(f"class {node.name.value} has no indented body to add to")
    return node.with_changes(body=node.body.with_changes(body=[*node.body.body, *statements]))


def statement(code: str, module: cst.Module) -> cst.BaseStatement:
    """Parse new code with the module's own indentation and line endings.

    The text is given the module's line endings first: a multi-line string keeps the ones it is
    written with, which the parser's configuration does not change."""
    if module.default_newline != "\n":
        code = code.replace("\n", module.default_newline)
    return cst.parse_statement(code, config=module.config_for_parsing)


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
