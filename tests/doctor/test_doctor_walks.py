"""doctor's tree walks visit what `ast.walk` visits, operators and contexts aside: `walk` in the
same order, `every_node` the same nodes, `walk_with_ancestors` the nodes spanning given lines
in pre-order with their ancestors. Checked against references built on `ast.iter_child_nodes`,
on a module with every kind of field, and on every module of the newest release."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence

import pytest

from sglpatch.doctor.read.source_tree import _EMPTY, every_node, walk, walk_with_ancestors
from tests.support import releases, wheels

SAMPLE = """\
import os.path as p
from . import x as y
global_ = {10: (256, 128), 9: [1, -2]}
@decorator(arg=1)
async def f(a, /, b: int = 2, *c, d, **e) -> None:
    global g
    async with open(a) as h, open(b):
        async for i in h:
            x = not i and i or (i if i else ~i)
    try:
        raise ValueError(f"{a!r:>{b}}") from None
    except* (TypeError, KeyError) as err:
        del err
    match a:
        case [1, *rest] | {"k": 2, **more} | Point(x=0) as q if q:
            pass
        case None:
            pass
    y: list[int] = [j async for j in c if j > 1]
    return lambda k=1: (yield k)
class C(Base, metaclass=M):
    def g(self):
        nonlocal_name = self.a[1:2, ...] @ self.b
        assert nonlocal_name >= 10, "needs 10"
"""


def _reference_walk(node: ast.AST) -> list[ast.AST]:
    return [n for n in ast.walk(node) if not isinstance(n, _EMPTY)]


def _reference_with_ancestors(
    node: ast.AST, lines: Sequence[int], ancestors: tuple[ast.AST, ...] = ()
) -> Iterator[tuple[ast.AST, tuple[ast.AST, ...]]]:
    yield node, ancestors
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _EMPTY):
            continue
        start = getattr(child, "lineno", None)
        if start is not None:
            end = getattr(child, "end_lineno", None) or start
            if not any(start <= line <= end for line in lines):
                continue
        yield from _reference_with_ancestors(child, lines, (*ancestors, node))


def _same_walks(tree: ast.AST, lines: Sequence[int]) -> None:
    for node in (tree, *getattr(tree, "body", ())):
        assert list(walk(node)) == _reference_walk(node)
    assert sorted(map(id, every_node(tree))) == sorted(map(id, _reference_walk(tree)))
    seen = [(node, tuple(ancestors)) for node, ancestors in walk_with_ancestors(tree, lines)]
    assert seen == list(_reference_with_ancestors(tree, lines))


@pytest.mark.parametrize("step", [1, 2, 5])
def test_the_walks_agree_with_ast_on_every_kind_of_field(step: int) -> None:
    tree = ast.parse(SAMPLE, feature_version=(3, 11))
    _same_walks(tree, list(range(1, SAMPLE.count("\n") + 1, step)))


@pytest.mark.wheel
def test_the_walks_agree_with_ast_on_the_newest_release() -> None:
    modules = 0
    for name in wheels.members(releases.NEWEST):
        if not name.endswith(".py") or not name.startswith("sglang/srt/layers/quantization/"):
            continue
        try:
            tree = ast.parse(wheels.member(releases.NEWEST, name))
        except SyntaxError:
            continue
        _same_walks(tree, sorted({getattr(n, "lineno", 1) for n in ast.walk(tree)})[::7])
        modules += 1
    assert modules > 30
