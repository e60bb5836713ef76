"""Values that reach a backend flag through a name: a local handed on to flags, and the KV cache
dtype a GPU is given by default, followed into the arms that test it.

- `field_of`: `default = "trtllm" if major >= 10 else "flashmla_kv"` (0.5.16 - 0.5.23, DSA)
  chooses `dsa_prefill_backend` and `dsa_decode_backend`, to which the function hands `default`.
- `KvDtype.defaults`: the dtypes `kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"`
  gives a GPU, so that an arm testing for one of them is taken by default, not by the user's
  `--kv-cache-dtype`.
- `KvDtype.arm_choices`: what those arms choose when they test no GPU themselves (0.5.7 - 0.5.9
  give every GPU FlashMLA for fp8_e4m3): the dtype's own capability test is then the gate.
"""

from __future__ import annotations

import ast
from collections.abc import Callable, Sequence

from sglpatch.doctor.gates import branches as branches_of
from sglpatch.doctor.gates import devices, entries
from sglpatch.doctor.gates.decisions import Function, enclosing, reaches
from sglpatch.doctor.gates.evaluator import Evaluator
from sglpatch.doctor.read.source_tree import walk, walk_with_ancestors

KV = "kv_cache_dtype"


def field_of(ancestors: Sequence[ast.AST]) -> str | None:
    """The backend flag an expression is assigned to (the nearest assignment or keyword), or,
    for a local name, the flag its function then assigns that name to."""
    for node in reversed(ancestors):
        if isinstance(node, ast.keyword):
            return node.arg
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = node.targets[0]
            name = branches_of.target_name(target)
            if isinstance(target, ast.Name) and entries.field_kind(target.id) is None:
                return _flows_into(ancestors, target.id) or name
            return name
        if isinstance(node, ast.AnnAssign):
            return branches_of.target_name(node.target)
        if isinstance(node, ast.stmt):
            return None
    return None


def _flows_into(ancestors: Sequence[ast.AST], local: str) -> str | None:
    """The first backend flag the enclosing function assigns the bare name `local` to."""
    function = next(
        (a for a in reversed(ancestors) if isinstance(a, (ast.FunctionDef, ast.AsyncFunctionDef))),
        None,
    )
    if function is None:
        return None
    for node in walk(function):
        if not (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Name)
            and node.value.id == local
        ):
            continue
        for target in node.targets:
            name = branches_of.target_name(target)
            if name is not None and entries.field_kind(name) is not None:
                return name
    return None


class KvDtype:
    """One module's KV cache dtype defaults and the arms that test for them."""

    def __init__(
        self,
        tree: ast.AST,
        wanted: Sequence[int],
        evaluator: Callable[[Function | None], Evaluator],
    ) -> None:
        self.tree = tree
        self.wanted = wanted
        self.evaluator = evaluator
        self._defaults: dict[devices.Device, frozenset[str]] = {}

    def defaults(self, device: devices.Device) -> frozenset[str]:
        """The dtypes `device` is given by a decision on the GPU that sets `kv_cache_dtype`:
        `"fp8_e4m3" if major >= 10 else ...` (0.5.7 - 0.5.9, 0.5.15+) or `if major >= 10:
        self.kv_cache_dtype = "fp8_e4m3"` (0.5.10 - 0.5.14), for DSA models."""
        if device not in self._defaults:
            found: set[str] = set()
            for node, ancestors in walk_with_ancestors(self.tree, self.wanted):
                if isinstance(node, ast.Assign) and _sets_kv(node) is not None:
                    value = node.value
                    if isinstance(value, ast.IfExp):
                        evaluator = self.evaluator(enclosing(ancestors))
                        found |= self._given(value, evaluator, device)
                elif isinstance(node, ast.If) and not _is_elif(node, ancestors):
                    found |= self._set_in_arms(node, self.evaluator(enclosing(ancestors)), device)
            self._defaults[device] = frozenset(found)
        return self._defaults[device]

    @staticmethod
    def _set_in_arms(node: ast.If, evaluator: Evaluator, device: devices.Device) -> set[str]:
        """The literals the arms of an `if` chain on the GPU that `device` takes set the dtype
        to, by a statement of their own."""
        tests: list[ast.expr] = []
        bodies: list[list[ast.stmt]] = []
        current: ast.If | None = node
        while current is not None:
            tests.append(current.test)
            bodies.append(current.body)
            orelse = current.orelse
            current = orelse[0] if len(orelse) == 1 and isinstance(orelse[0], ast.If) else None
            if current is None:
                bodies.append(orelse)
        if not any(evaluator.depends_on_device(t) for t in tests):
            return set()
        return {
            literal
            for index in branches_of.reach(evaluator, tests, device)
            for statement in bodies[index]
            if isinstance(statement, ast.Assign) and (literal := _sets_kv(statement)) is not None
        }

    @staticmethod
    def _given(expression: ast.expr, evaluator: Evaluator, device: devices.Device) -> set[str]:
        tests: list[ast.expr] = []
        values: list[ast.expr] = []
        while isinstance(expression, ast.IfExp):
            tests.append(expression.test)
            values.append(expression.body)
            expression = expression.orelse
        values.append(expression)
        if not any(evaluator.depends_on_device(t) for t in tests):
            return set()
        return {
            value.value
            for value in (values[i] for i in branches_of.reach(evaluator, tests, device))
            if isinstance(value, ast.Constant) and isinstance(value.value, str)
        }

    def arm_choices(
        self, chosen: Sequence[ast.AST], device: devices.Device
    ) -> list[branches_of.Choice]:
        """What the arms testing for the dtype `chosen` gives (`if kv_cache_dtype ==
        "fp8_e4m3":`), and testing no GPU themselves, choose on `device`."""
        values = {
            n.value for n in chosen if isinstance(n, ast.Constant) and isinstance(n.value, str)
        }
        found: list[branches_of.Choice] = []
        for node, ancestors in walk_with_ancestors(self.tree, self.wanted):
            if not (isinstance(node, ast.If) and _tested_dtype(node.test) in values):
                continue
            evaluator = self.evaluator(enclosing(ancestors))
            if evaluator.depends_on_device(node.test):
                continue  # a decision of its own
            if not reaches(evaluator, node, ancestors, device):
                continue  # an `elif` after the GPU's own arm (sm120-dsa-backends' `major == 12`)
            found += branches_of.choices(evaluator, node.body, device)
        return found


def _sets_kv(node: ast.Assign) -> str | None:
    """`kv_cache_dtype = "fp8_e4m3"` -> "fp8_e4m3"; "" for a conditional expression's
    assignment; None for anything else."""
    if len(node.targets) != 1 or branches_of.target_name(node.targets[0]) != KV:
        return None
    value = node.value
    if isinstance(value, ast.IfExp):
        return ""
    return value.value if isinstance(value, ast.Constant) and isinstance(value.value, str) else None


def _is_elif(node: ast.If, ancestors: Sequence[ast.AST]) -> bool:
    parent = ancestors[-1] if ancestors else None
    return isinstance(parent, ast.If) and parent.orelse == [node]


def _tested_dtype(test: ast.expr) -> str | None:
    """`kv_cache_dtype == "fp8_e4m3"` (or `self.kv_cache_dtype ...`) -> "fp8_e4m3"."""
    if not (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and branches_of.target_name(test.left) == KV
    ):
        return None
    right = test.comparators[0]
    return right.value if isinstance(right, ast.Constant) and isinstance(right.value, str) else None
