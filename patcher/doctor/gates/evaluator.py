"""What a capability test in SGLang's source evaluates to on a given GPU.

A test is evaluated concretely for a few devices, (major, minor): `get_device_capability()` is
the pair, `[0]` the major, `get_device_sm()` is `major * 10 + minor`, and SGLang's helpers
(`is_sm100_supported()`, `is_blackwell()`, ...) are true for the majors SGLang's own definition
lists. Names assigned from such expressions (`major, minor = get_device_capability()`,
`_is_sm100_supported = _is_cuda and is_sm100_supported()`) are followed. Anything else the test
depends on (a flag, `is_flashinfer_available()`) is unknown; the scanner evaluates each test in
two worlds, every unknown true and every unknown false, so a device's part shows in one of them.
"""

from __future__ import annotations

import ast
import operator
from collections.abc import Callable
from typing import Any, Union

from sglpatch.doctor.facts.sglang import PLATFORM, PROBE, PROBE_VALUES
from sglpatch.doctor.gates.devices import (
    DEVICES,
    NEW,
    RTX_BLACKWELL,
    Aliases,
    Device,
    Helpers,
    Holds,
    helper_majors,
    holds_on,
    is_platform,
    only_new,
    probe_of,
)
from sglpatch.doctor.read.source_tree import walk

_CAPABILITY_NAMES = {"major", "cc_major", "sm_major", "device_major"}


class CapabilityLike:
    """A value named like a capability whose shape is unknown: an int major or a pair.

    Compared with a small int it is the major, with a large one the SM number, with a pair the
    pair; `[0]` is the major.
    """

    def __init__(self, device: Device) -> None:
        self.device = device


Value = Union[bool, int, tuple[int, ...], CapabilityLike, None]  # noqa: UP007 (runtime alias)


_COMPARE: dict[type[ast.cmpop], Callable[[Any, Any], bool]] = {
    ast.Eq: operator.eq,
    ast.NotEq: operator.ne,
    ast.Lt: operator.lt,
    ast.LtE: operator.le,
    ast.Gt: operator.gt,
    ast.GtE: operator.ge,
}


class Evaluator:
    """Evaluate expressions of one scope (a module, and a function in it) on a device."""

    def __init__(
        self,
        helpers: Helpers,
        module_aliases: Aliases,
        local_aliases: Aliases,
        defined: frozenset[str],
    ) -> None:
        self.helpers = helpers
        self.module_aliases = module_aliases
        self.local_aliases = local_aliases
        self.defined = defined  # functions the module defines itself: not SGLang's helpers
        # A test is asked about the same device several times (does it depend on the device,
        # which branch, which line): remembered per node, which lives as long as this scope.
        self._truths: dict[tuple[int, Device, bool], bool] = {}
        # Likewise `branches`' texts of tests' leaves, and the branches a chain's leaves reach.
        self.texts: dict[int, str] = {}
        self.reached: dict[tuple[tuple[int, ...], tuple[object, ...]], list[int]] = {}
        # Whether the evaluation under way read the device, or the world (an unknown's truth).
        self._read_device = self._read_world = False

    def truth(self, node: ast.expr, device: Device, world: bool) -> bool:
        key = (id(node), device, world)
        known = self._truths.get(key)
        if known is not None:
            return known
        self._read_device = self._read_world = False
        value = self.value(node, device, world, 0)
        truth = self._truth_of(value, world)
        # Most tests read neither (a flag, `_is_cuda`): one evaluation answers for them all.
        devices = (device,) if self._read_device else DEVICES
        for other in devices:
            for each in (world,) if self._read_world else (True, False):
                self._truths[(id(node), other, each)] = truth
        return truth

    def _truth_of(self, value: Value, world: bool) -> bool:
        if value is None or isinstance(value, CapabilityLike):
            self._read_world = True
            return world
        return bool(value)

    def depends_on_device(self, node: ast.expr) -> bool:
        return any(
            len({self.truth(node, device, world) for device in DEVICES}) > 1
            for world in (True, False)
        )

    def unreachable(self, node: ast.expr) -> bool:
        """A test false on these GPUs whatever else holds (`if _is_hip:`): its body never runs."""
        return not any(self.truth(node, d, w) for d in DEVICES for w in (True, False))

    def is_quantity(self, node: ast.expr) -> bool:
        """A capability, major, minor or SM number (not a constant, not a truth value)."""
        if isinstance(node, ast.Constant):
            return False
        value = self.value(node, RTX_BLACKWELL, True, 0)
        return isinstance(value, (CapabilityLike, tuple)) or (
            type(value) is int and value in (NEW, 0, NEW * 10)
        )

    def names_new(self, node: ast.expr, depth: int = 0) -> bool:
        """The test names capability 12 itself: `== 12`, `in (8, 12)`, `is_sm120_supported()`."""
        for part in walk(node):
            if isinstance(part, ast.Call) and isinstance(part.func, ast.Name):
                majors = self._helper(part.func.id)
                if majors is not None and only_new(majors):
                    return True
            elif (probe := self.probe(part)) is not None:
                probed = self.helpers.get(PROBE + probe)
                if probed is not None and only_new(probed):
                    return True
            elif isinstance(part, ast.Name) and depth < 3 and self._alias_names_new(part.id, depth):
                return True
            elif isinstance(part, ast.Compare):
                sides = [part.left, *part.comparators]
                if any(self.is_quantity(s) for s in sides) and any(_mentions_new(s) for s in sides):
                    return True
        return False

    def _alias_names_new(self, name: str, depth: int) -> bool:
        for table in (self.local_aliases, self.module_aliases):
            if name in table:
                return any(
                    self.names_new(value, depth + 1)
                    for value, _ in table[name]
                    if not (isinstance(value, ast.Name) and value.id == name)
                )
        return False

    def _helper(self, name: str) -> Holds | None:
        if name in self.defined and name not in self.helpers:
            return None
        return helper_majors(name, self.helpers)

    def value(self, node: ast.expr, device: Device, world: bool, depth: int) -> Value:
        if depth > 8:
            return None
        if isinstance(node, ast.Constant):
            constant = node.value
            return constant if isinstance(constant, (int, bool)) else None
        if isinstance(node, ast.Tuple):
            items = [self.value(e, device, world, depth + 1) for e in node.elts]
            return tuple(items) if all(type(i) is int for i in items) else None  # type: ignore[arg-type]
        if isinstance(node, ast.BoolOp):
            values = [self.truth_at(v, device, world, depth) for v in node.values]
            return all(values) if isinstance(node.op, ast.And) else any(values)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return not self.truth_at(node.operand, device, world, depth)
        if isinstance(node, ast.Compare):
            return self._compare(node, device, world, depth)
        if isinstance(node, ast.BinOp):
            return self._arithmetic(node, device, world, depth)
        if isinstance(node, ast.Subscript):
            return self._subscript(node, device, world, depth)
        if isinstance(node, ast.Call):
            return self._call(node, device)
        if isinstance(node, ast.Name):
            return self._name(node.id, device, world, depth)
        if isinstance(node, ast.Attribute):
            probe = self.probe(node)
            if probe is not None:
                return self._probe(probe, device)
            # `version.major` is a library's; only capability-named attributes count
            return self._capability_like(device) if "capabilit" in node.attr.lower() else None
        if isinstance(node, ast.IfExp):
            test = self.value(node.test, device, world, depth + 1)
            if test is None or isinstance(test, CapabilityLike):
                return None
            return self.value(node.body if test else node.orelse, device, world, depth + 1)
        return None

    def _arithmetic(self, node: ast.BinOp, device: Device, world: bool, depth: int) -> Value:
        """`major * 10 + minor`: sums and products of ints; anything else is unknown."""
        left = self.value(node.left, device, world, depth + 1)
        right = self.value(node.right, device, world, depth + 1)
        if type(left) is int and type(right) is int:
            if isinstance(node.op, ast.Add):
                return left + right
            if isinstance(node.op, ast.Mult):
                return left * right
        return None

    def _subscript(self, node: ast.Subscript, device: Device, world: bool, depth: int) -> Value:
        """`[0]` or `[1]` of a capability pair; other indexes are unknown."""
        base = self.value(node.value, device, world, depth + 1)
        index = node.slice
        if not (isinstance(index, ast.Constant) and index.value in (0, 1)):
            return None
        position = 0 if index.value == 0 else 1
        if isinstance(base, CapabilityLike):
            return base.device[position]
        if isinstance(base, tuple) and len(base) == 2:
            return base[position]
        return None

    def _call(self, node: ast.Call, device: Device) -> Value:
        """A capability probe (`torch.cuda.get_device_capability()`), or a bare call of a
        platform check or of one of SGLang's helpers (`is_sm100_supported()`)."""
        major, minor = device
        name = _last_name(node.func)
        if name == "get_device_capability":
            self._read_device = True
            return (major, minor)
        if name == "get_device_sm":
            self._read_device = True
            return major * 10 + minor
        if isinstance(node.func, ast.Name) and not node.args and not node.keywords:
            if name in PLATFORM:
                return PLATFORM[name]
            majors = self._helper(name)
            if majors is not None:
                self._read_device = True
                return holds_on(majors, (major, minor))
        if "capabilit" in name.lower() and not node.args:
            return self._capability_like(device)
        return None

    def _capability_like(self, device: Device) -> CapabilityLike:
        self._read_device = True
        return CapabilityLike(device)

    def _name(self, name: str, device: Device, world: bool, depth: int) -> Value:
        """A platform flag, a name assigned in the scope, or one read by its spelling."""
        if name in PLATFORM:
            return PLATFORM[name]
        if name in self.local_aliases or name in self.module_aliases:
            found = self._alias(name, device, world, depth)
            # `compute_capability = probe() if x is None else x`: trust a strong name
            if found is not None or "capabilit" not in name.lower():
                return found
        return self._named(name, device)

    def probe(self, node: ast.AST) -> str | None:
        """`is_sm100` for `get_platform().is_sm100`, and for `p.is_sm100` in a scope that
        assigns `p = get_platform()` (and nothing else to `p`)."""
        found = probe_of(node)
        if found is None and isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
            for table in (self.local_aliases, self.module_aliases):
                if node.value.id in table:
                    values = table[node.value.id]
                    if all(index is None and is_platform(value) for value, index in values):
                        return node.attr
                    return None
        return found

    def _probe(self, probe: str, device: Device) -> Value:
        """`get_platform().<probe>` on `device`: SGLang's answer, as its helper gives it."""
        major, minor = device
        majors = self.helpers.get(PROBE + probe)
        if majors is not None:
            self._read_device = True
            return holds_on(majors, device)
        if probe in PLATFORM:
            return PLATFORM[probe]
        if PROBE_VALUES.get(probe) in ("get_device_sm", "get_device_capability"):
            self._read_device = True
            return major * 10 + minor if PROBE_VALUES[probe] == "get_device_sm" else (major, minor)
        return None

    def truth_at(self, node: ast.expr, device: Device, world: bool, depth: int) -> bool:
        return self._truth_of(self.value(node, device, world, depth + 1), world)

    def _alias(self, name: str, device: Device, world: bool, depth: int) -> Value:
        for table in (self.local_aliases, self.module_aliases):
            if name not in table:
                continue
            values = [self._unpack(e, index, device, world, depth) for e, index in table[name]]
            if len({repr(value) for value in values}) != 1:
                return None  # assigned differently in different places
            return values[0]
        return None

    def _unpack(
        self, expr: ast.expr, index: int | None, device: Device, world: bool, depth: int
    ) -> Value:
        value = self.value(expr, device, world, depth + 1)
        if index is None:
            return value
        if isinstance(value, CapabilityLike):
            return value.device[index] if index < 2 else None
        if isinstance(value, tuple) and index < len(value):
            return value[index]
        return None

    def _named(self, name: str, device: Device) -> Value:
        lowered = name.lower()
        if "capabilit" in lowered:
            return self._capability_like(device)
        if lowered in _CAPABILITY_NAMES or lowered == "minor":
            self._read_device = True
            return device[0] if lowered in _CAPABILITY_NAMES else device[1]
        return None

    def _compare(self, node: ast.Compare, device: Device, world: bool, depth: int) -> Value:
        left = self.value(node.left, device, world, depth + 1)
        result = True
        for op, right_node in zip(node.ops, node.comparators, strict=True):
            right = self.value(right_node, device, world, depth + 1)
            if isinstance(op, (ast.In, ast.NotIn)):
                found = _member(left, right_node, device)
                if found is None:
                    return None
                outcome = found if isinstance(op, ast.In) else not found
            elif type(op) in _COMPARE:
                pair = _comparable(left, right, device)
                if pair is None:
                    return None
                outcome = _COMPARE[type(op)](*pair)
            else:
                return None
            result = result and outcome
            left = right
        return result


def _comparable(left: Value, right: Value, device: Device) -> tuple[object, object] | None:
    """Resolve a capability-like side by the shape of the other side."""
    if isinstance(left, CapabilityLike) and isinstance(right, CapabilityLike):
        return None
    if isinstance(right, CapabilityLike):
        flipped = _comparable(right, left, device)
        return None if flipped is None else (flipped[1], flipped[0])
    if isinstance(left, CapabilityLike):
        if type(right) is int:
            return (device[0] * 10 + device[1], right) if right >= 20 else (device[0], right)
        if isinstance(right, tuple):
            return device, right
        return None
    if left is None or right is None or isinstance(left, bool) or isinstance(right, bool):
        return None
    return left, right


def _member(left: Value, collection: ast.expr, device: Device) -> bool | None:
    if not isinstance(collection, (ast.Tuple, ast.List, ast.Set)):
        return None
    items: list[object] = []
    for element in collection.elts:
        if isinstance(element, ast.Constant) and type(element.value) is int:
            items.append(element.value)
        elif isinstance(element, ast.Tuple) and all(
            isinstance(e, ast.Constant) and type(e.value) is int for e in element.elts
        ):
            items.append(tuple(e.value for e in element.elts if isinstance(e, ast.Constant)))
        else:
            return None
    if left is None or isinstance(left, bool):
        return None
    for item in items:
        pair = _comparable(left, item, device)  # type: ignore[arg-type]
        if pair is not None and pair[0] == pair[1]:
            return True
    return False


def _mentions_new(node: ast.expr) -> bool:
    for part in walk(node):
        if (
            isinstance(part, ast.Constant)
            and type(part.value) is int
            and (part.value == NEW or NEW * 10 <= part.value < NEW * 10 + 10)
        ):
            return True
    return False


def _last_name(node: ast.expr) -> str:
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return ""
