"""The GPUs doctor asks about, and what SGLang's source says about them: its capability helpers
(`is_sm100_supported()` is true on major 10, read from the target's own definitions where it has
them), its platform probes (`_is_cuda`, `_is_hip`) and the names a scope assigns, which
`evaluator` follows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence

from sglpatch.doctor.facts import gpus
from sglpatch.doctor.facts.sglang import KNOWN_HELPERS, PROBE, SM_NAME
from sglpatch.doctor.read import chunks
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source

Device = gpus.Capability  # (major, minor): what a gate is evaluated for
DEVICES: tuple[Device, ...] = tuple(gpu.capability for gpu in gpus.GPUS)
AMPERE, HOPPER, B200, RTX_BLACKWELL, GB10 = DEVICES
NEW = gpus.NEW


def helpers_of(source: Source) -> dict[str, frozenset[int]]:
    """The helper table, with the target's own definitions overriding the known ones."""
    table = dict(KNOWN_HELPERS)
    utils = source.package_dir / "srt" / "utils" / "common.py"
    if not source.is_file(utils):
        utils = source.package_dir / "srt" / "utils.py"
    text = source.text(utils)
    tree = None
    if "device_capability_majors" in text:
        try:
            tree = chunks.around(text, re.compile("device_capability_majors"))
        except TOO_DEEP:  # the known helpers stand
            source.note(source.shown(utils), TOO_DEEP_WHY)
    for node in tree.body if tree else ():
        if not isinstance(node, ast.Assign):
            continue
        for call in ast.walk(node.value):
            if not isinstance(call, ast.Call):
                continue
            for keyword in call.keywords:
                if keyword.arg == "device_capability_majors" and isinstance(
                    keyword.value, (ast.List, ast.Tuple, ast.Set)
                ):
                    majors = frozenset(
                        e.value
                        for e in keyword.value.elts
                        if isinstance(e, ast.Constant) and type(e.value) is int
                    )
                    for target in node.targets:
                        for name in ast.walk(target):
                            if isinstance(name, ast.Name):
                                table[name.id] = majors
    for probe, helper in _platform_probes(source).items():
        if (probed := helper_majors(helper, table)) is not None:
            table[PROBE + probe] = probed
    return table


def _platform_probes(source: Source) -> dict[str, str]:
    """probe -> helper, as the target's `_PLATFORM_PROBES` maps them (none before 0.5.19)."""
    path = source.package_dir / "srt" / "runtime_context.py"
    text = source.text(path)
    if "_PLATFORM_PROBES" not in text:
        return {}
    try:
        tree = chunks.around(text, re.compile(r"^_PLATFORM_PROBES\b", re.MULTILINE))
    except TOO_DEEP:
        source.note(source.shown(path), TOO_DEEP_WHY)
        return {}
    for node in tree.body if tree else ():
        value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
        if isinstance(value, ast.Dict) and "_PLATFORM_PROBES" in ast.unparse(node):
            return {
                key.value: item.value
                for key, item in zip(value.keys, value.values, strict=True)
                if isinstance(key, ast.Constant)
                and isinstance(key.value, str)
                and isinstance(item, ast.Constant)
                and isinstance(item.value, str)
            }
    return {}


def probe_of(node: ast.AST) -> str | None:
    """`is_sm100` for `get_platform().is_sm100`, else None."""
    if isinstance(node, ast.Attribute) and is_platform(node.value):
        return node.attr
    return None


def is_platform(node: ast.AST) -> bool:
    """`get_platform()`: SGLang's platform facade."""
    return isinstance(node, ast.Call) and not node.args and _called(node.func) == "get_platform"


def _called(func: ast.expr) -> str:
    return (
        func.attr
        if isinstance(func, ast.Attribute)
        else func.id
        if isinstance(func, ast.Name)
        else ""
    )


def helper_majors(name: str, helpers: Mapping[str, frozenset[int]]) -> frozenset[int] | None:
    if name in helpers:
        return helpers[name]
    match = SM_NAME.match(name)
    if match:
        number = int(match.group(1))
        return frozenset({number // 10})
    return None


Aliases = Mapping[str, Sequence[tuple[ast.expr, int | None]]]  # name -> (value, unpack index)


def aliases_in(
    body: Sequence[ast.stmt] | ast.AST, deep: bool
) -> dict[str, list[tuple[ast.expr, int | None]]]:
    """Names assigned in a scope: `x = expr` and `a, b = expr` (index 0, 1)."""
    found: dict[str, list[tuple[ast.expr, int | None]]] = {}
    nodes: Iterator[ast.AST]
    if isinstance(body, ast.AST):
        nodes = ast.walk(body)
    elif deep:
        nodes = (n for stmt in body for n in ast.walk(stmt))
    else:
        nodes = iter(_top_level(body))
    for node in nodes:
        if not isinstance(node, ast.Assign):
            continue
        for target in node.targets:
            if isinstance(target, ast.Name):
                found.setdefault(target.id, []).append((node.value, None))
            elif isinstance(target, ast.Tuple):
                for index, element in enumerate(target.elts):
                    if isinstance(element, ast.Name):
                        found.setdefault(element.id, []).append((node.value, index))
    return found


def _top_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    for node in body:
        yield node
        if isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(block)
        elif isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)
