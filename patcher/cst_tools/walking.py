"""Walking LibCST trees fast: by their dataclass fields, not by libcst's visitors.

`walk` visits every node under another, `find_compound` only blocks and statements (never an
expression), `_path_to` finds how to rebuild a tree around one node.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from typing import TypeGuard, TypeVar

import libcst as cst

T = TypeVar("T", bound=cst.CSTNode)


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


def walk(node: cst.CSTNode, kind: type[T]) -> Iterator[T]:
    """Every node of type `kind` under `node` (public form of `_walk`)."""
    return _walk(node, kind)


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


Step = tuple[cst.CSTNode, str, "int | None"]


def _path_to(
    root: cst.CSTNode, target: cst.CSTNode, blocks_only: bool = False
) -> list[Step] | None:
    """The (parent, field, index) steps from `root` down to `target`, searched in source order
    (anchors sit near the top of their files) with parent links instead of copied paths.
    `blocks_only`: descend through blocks and statements alone, where a statement is found
    several times faster (it lies in no expression)."""
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
                if not blocks_only or value is target or _block_part(value):
                    parents[id(value)] = (node, (node, field, None))
                    children.append(value)
            elif isinstance(value, (list, tuple)):
                for index, item in enumerate(value):
                    if isinstance(item, cst.CSTNode) and (
                        not blocks_only or item is target or _block_part(item)
                    ):
                        parents[id(item)] = (node, (node, field, index))
                        children.append(item)
        stack.extend(reversed(children))
    return None
