"""The GPUs doctor asks about, and what SGLang's source says about them: its capability helpers
(`is_sm100_supported()` is true on major 10, read from the target's own definitions where it has
them), its platform probes (`_is_cuda`, `_is_hip`) and the names a scope assigns, which
`evaluator` follows.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Mapping, Sequence

from sglpatch.doctor import chunks
from sglpatch.doctor.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source

Device = tuple[int, int]  # (major, minor)
AMPERE: Device = (8, 0)
HOPPER: Device = (9, 0)
B200: Device = (10, 0)
RTX_BLACKWELL: Device = (12, 0)
GB10: Device = (12, 1)  # DGX Spark
DEVICES = (AMPERE, HOPPER, B200, RTX_BLACKWELL, GB10)
NEW = 12

# SGLang's own helpers, as its `srt/utils/common.py` defines them (read from the target when it
# has them: `partial(_check_cuda_device_version, device_capability_majors=[...])`).
KNOWN_HELPERS: dict[str, frozenset[int]] = {
    "is_sm90_supported": frozenset({9}),
    "is_sm100_supported": frozenset({10}),
    "is_sm120_supported": frozenset({12}),
    "is_blackwell_supported": frozenset({10, 11, 12}),
    "is_blackwell": frozenset({10, 11, 12}),
    "is_hopper_with_cuda_12_3": frozenset({9}),
    "is_ampere_with_cuda_12_3": frozenset({8}),
    "is_sm100_or_newer": frozenset({10, 11, 12, 13}),
}
# `is_sm120()`, `is_sm121()`, `is_sm100_supported()`: the SM number in the name.
_SM_NAME = re.compile(r"_?is_sm(\d{2,3})(?:_supported)?$")
# The GPUs in question are NVIDIA's: SGLang's platform probes have known answers on them.
PLATFORM = {
    "is_cuda": True,
    "_is_cuda": True,
    "is_cuda_alike": True,
    "_is_cuda_alike": True,
    "is_hip": False,
    "_is_hip": False,
    "is_npu": False,
    "_is_npu": False,
    "is_xpu": False,
    "_is_xpu": False,
    "is_cpu": False,
    "_is_cpu": False,
    "is_musa": False,
    "_is_musa": False,
    "is_host_cpu_x86": False,
}


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


# From 0.5.19 SGLang also asks `get_platform().is_sm100`: a probe that `srt/runtime_context.py`
# maps to a helper (`_PLATFORM_PROBES = {"is_sm100": "is_sm100_supported", ...}`). The table
# holds such a probe as "get_platform().is_sm100", with its helper's majors.
PROBE = "get_platform()."
# `_PLATFORM_VALUES` there: the probes that are the device's numbers, not yes/no.
PROBE_VALUES = {"device_sm": "get_device_sm", "device_capability": "get_device_capability"}


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
    match = _SM_NAME.match(name)
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
