"""The GPUs doctor asks about, and what SGLang's source says about them: its capability helpers
(`is_sm100_supported()` is true on major 10, read from the target's own definitions where it has
them), its platform probes (`_is_cuda`, `_is_hip`) and the names a scope assigns, which
`evaluator` follows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sglpatch.doctor.facts import gpus
from sglpatch.doctor.facts.sglang import KNOWN_HELPERS, PROBE, SM_NAME
from sglpatch.doctor.read import chunks
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source

Device = gpus.Capability  # (major, minor): what a gate is evaluated for
# What a capability helper is true on: majors (`is_sm100_supported()`: 10), or exact
# capabilities (0.5.23's `is_sm121()`: (12, 1), GB10 alone).
Holds = frozenset[int | tuple[int, int]]
Helpers = Mapping[str, Holds]
# A helper comparing the capability to one value: `get_device_capability() == (12, 1)`.
_EXACT = re.compile(r"get_device_capability\(\)\s*==\s*\(\s*\d+\s*,\s*\d+\s*\)")
DEVICES: tuple[Device, ...] = tuple(gpu.capability for gpu in gpus.GPUS)
AMPERE, HOPPER, B200, RTX_BLACKWELL, GB10 = DEVICES
NEW = gpus.NEW


def holds_on(helper: Holds, device: Device) -> bool:
    return device[0] in helper or (device[0], device[1]) in helper


def only_new(helper: Holds) -> bool:
    """True on capability 12 alone (or on one of its parts)."""
    return bool(helper) and all((h if isinstance(h, int) else h[0]) == NEW for h in helper)


def helpers_of(source: Source) -> dict[str, Holds]:
    """The helper table, with the target's own definitions overriding the known ones."""
    table: dict[str, Holds] = dict(KNOWN_HELPERS)
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
    table.update(_exact_helpers(source, text, utils))
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


def _exact_helpers(source: Source, text: str, utils: Path) -> dict[str, Holds]:
    """`def is_sm121() -> bool: return is_cuda() and get_device_capability() == (12, 1)`: a
    helper true on one capability, minor included (0.5.23's `is_sm120()` excludes GB10)."""
    if not _EXACT.search(text):
        return {}
    try:
        tree = chunks.around(text, _EXACT)
    except TOO_DEEP:
        source.note(source.shown(utils), TOO_DEEP_WHY)
        return {}
    found: dict[str, Holds] = {}
    for node in tree.body if tree else ():
        if not (isinstance(node, ast.FunctionDef) and not node.args.args):
            continue
        values = {
            pair
            for c in ast.walk(node)
            if isinstance(c, ast.Compare)
            and isinstance(c.ops[0], ast.Eq)
            and "get_device_capability" in ast.unparse(c.left)
            and (pair := _pair(c.comparators[0])) is not None
        }
        if len(values) == 1:
            found[node.name] = frozenset(values)
    return found


def _pair(node: ast.expr) -> tuple[int, int] | None:
    """`(12, 1)` as written."""
    if not (isinstance(node, ast.Tuple) and len(node.elts) == 2):
        return None
    major, minor = (e.value if isinstance(e, ast.Constant) else None for e in node.elts)
    return (major, minor) if type(major) is int and type(minor) is int else None


def helper_majors(name: str, helpers: Helpers) -> Holds | None:
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
