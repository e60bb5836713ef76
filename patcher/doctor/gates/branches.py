"""Which branches of a capability decision a GPU reaches, and what those branches choose.

A test is evaluated in three values (Kleene's): true, false, or unknown (a flag, the model,
`is_flashinfer_available()`). A device reaches every branch whose test is not false, up to the
first whose test is true, so `elif is_blackwell_supported() and is_flashinfer_available():`
behind `if deep_gemm_wrapper.ENABLE_JIT_DEEPGEMM:` is reached by 12 (the first test unknown, the
second's capability part true). What a reached branch chooses is read from its statements
(`entries`): backend flags set to literals, kernel entry points named, flag functions that turn
a kernel on. A branch is opt-in when only a flag the user passes leads there (`if
self.enable_torch_symm_mem:`, `--fp8-gemm-backend=flashinfer_trtllm`).
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Iterator, Sequence

from sglpatch.doctor.facts import sglang
from sglpatch.doctor.gates import entries
from sglpatch.doctor.gates.devices import Device
from sglpatch.doctor.gates.evaluator import Evaluator
from sglpatch.doctor.read.source_tree import last_name, walk

Tri = bool | None
# (table kind, record name, the flag or entry point that chose it)
Choice = tuple[str, str, str]

# On NVIDIA GPUs `server_args.device` is "cuda": `self.device == "xpu"` is false there.
_DEVICE_OWNERS = frozenset({"self", "server_args", "args"})
_NOT_CUDA = frozenset({"cpu", "xpu", "npu", "hpu", "mps", "musa", "hip", "mlu"})


def tri(evaluator: Evaluator, node: ast.expr, device: Device) -> Tri:
    """The test's truth on `device`: True, False, or None (it depends on something else)."""
    if isinstance(node, ast.BoolOp):
        values = [tri(evaluator, v, device) for v in node.values]
        if isinstance(node.op, ast.And):
            return False if False in values else (True if all(values) else None)
        return True if True in values else (False if all(v is False for v in values) else None)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        inner = tri(evaluator, node.operand, device)
        return None if inner is None else not inner
    device_string = _device_string(node)
    if device_string is not None:
        return device_string
    known, unknown = (evaluator.truth(node, device, world) for world in (True, False))
    return known if known == unknown else None


def _device_string(node: ast.expr) -> Tri:
    """`self.device == "cuda"` (True), `server_args.device != "cpu"` (True), else None."""
    if not (isinstance(node, ast.Compare) and len(node.ops) == 1):
        return None
    left, right = node.left, node.comparators[0]
    if not (
        isinstance(left, ast.Attribute)
        and left.attr == "device"
        and isinstance(left.value, ast.Name)
        and left.value.id in _DEVICE_OWNERS
        and isinstance(right, ast.Constant)
        and isinstance(right.value, str)
    ):
        return None
    if right.value != "cuda" and right.value not in _NOT_CUDA:
        return None
    same = right.value == "cuda"
    if isinstance(node.ops[0], ast.Eq):
        return same
    if isinstance(node.ops[0], ast.NotEq):
        return not same
    return None


def reach(evaluator: Evaluator, tests: Sequence[ast.expr], device: Device) -> list[int]:
    """The branches `device` can take (index len(tests): the else, or past the block).

    The unknown parts of the tests (`is_mxfp4_quant_format`) are tried both ways, together,
    when they are few: `if is_sm120_supported() and x: ... elif is_blackwell() and x:` sends
    12 to the first branch or past both, never to the second.
    """
    leaves: dict[int, Tri | str] = {}
    atoms: dict[str, None] = {}
    for test in tests:
        _atoms(evaluator, test, device, leaves, atoms)
    # The answer follows from the leaves' truths alone: devices that agree on them share it.
    known = (tuple(map(id, tests)), tuple(leaves.values()))
    if known in evaluator.reached:
        return evaluator.reached[known]
    if len(atoms) > _MOST_ATOMS:
        found = set(_reach_kleene(evaluator, tests, device))
    else:
        found = set()
        for values in itertools.product((True, False), repeat=len(atoms)):
            given = dict(zip(atoms, values, strict=True))
            taken = (i for i, test in enumerate(tests) if _given(test, leaves, given))
            found.add(next(taken, len(tests)))
    evaluator.reached[known] = sorted(found)
    return evaluator.reached[known]


_MOST_ATOMS = 5  # unknown parts tried both ways together: 2**5 cases at most


def _atoms(
    evaluator: Evaluator,
    node: ast.expr,
    device: Device,
    leaves: dict[int, Tri | str],
    atoms: dict[str, None],
) -> None:
    """Each leaf's truth on `device`; an unknown one as its text, the same for every device."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            _atoms(evaluator, value, device, leaves, atoms)
    elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        _atoms(evaluator, node.operand, device, leaves, atoms)
    else:
        truth = tri(evaluator, node, device)
        if truth is None:
            key = _key(evaluator, node)
            atoms[key] = None
            leaves[id(node)] = key
        else:
            leaves[id(node)] = truth


def _given(node: ast.expr, leaves: dict[int, Tri | str], given: dict[str, bool]) -> bool:
    if isinstance(node, ast.BoolOp):
        parts = (_given(v, leaves, given) for v in node.values)
        return all(parts) if isinstance(node.op, ast.And) else any(parts)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
        return not _given(node.operand, leaves, given)
    truth = leaves[id(node)]
    return given[truth] if isinstance(truth, str) else bool(truth)


def _key(evaluator: Evaluator, node: ast.expr) -> str:
    """A leaf's text (unparsed once per scope: `ast.unparse` is slow)."""
    key = evaluator.texts.get(id(node))
    if key is None:
        try:
            key = ast.unparse(node)
        except (ValueError, AttributeError, RecursionError):
            key = str(id(node))
        evaluator.texts[id(node)] = key
    return key


def _reach_kleene(evaluator: Evaluator, tests: Sequence[ast.expr], device: Device) -> list[int]:
    found = []
    for index, test in enumerate(tests):
        truth = tri(evaluator, test, device)
        if truth is False:
            continue
        found.append(index)
        if truth is True:
            return found
    found.append(len(tests))
    return found


def decided(
    evaluator: Evaluator,
    tests: Sequence[ast.expr],
    reached: dict[Device, list[int]],
    device: Device,
    others: Sequence[Device],
) -> list[int]:
    """The branches `device` takes because of the GPU: its own capability test lets it in, or
    one of `others` never gets there (12 sent to the `else` that 10 never reaches)."""
    found = []
    for index in reached[device]:
        own = (
            index < len(tests)
            and evaluator.depends_on_device(tests[index])
            and tri(evaluator, tests[index], device) is not False
        )
        if own or any(index not in reached[other] for other in others):
            found.append(index)
    return found


def choices(
    evaluator: Evaluator,
    nodes: Sequence[ast.AST],
    device: Device,
    field: str | None = None,
    returns: str | None = None,
) -> list[Choice]:
    """What `nodes` (a branch's statements, or an expression assigned to `field`) choose on
    `device`: nested `if`s the device cannot enter are left out. `returns`: the function they
    are in, whose returned literals are a backend flag's value when its name is one's."""
    found: list[Choice] = []
    for node in nodes:
        if isinstance(node, ast.If):
            truth = tri(evaluator, node.test, device)
            if truth is not False:
                found += choices(evaluator, node.body, device, returns=returns)
            if truth is not True:
                found += choices(evaluator, node.orelse, device, returns=returns)
            continue
        if isinstance(node, ast.expr) and field is not None:
            found += _values(field, node)
        if isinstance(node, ast.Return) and node.value is not None and returns is not None:
            found += _values(returns, node.value)
        for part in walk(node):
            found += _chosen(part)
    return list(dict.fromkeys(found))


def _chosen(node: ast.AST) -> Iterator[Choice]:
    if isinstance(node, ast.Assign):
        for target in node.targets:
            if isinstance(target, ast.Tuple) and isinstance(node.value, ast.Tuple):
                for name, value in zip(target.elts, node.value.elts, strict=False):
                    yield from _values(target_name(name), value)
            else:
                yield from _values(target_name(target), node.value)
    elif isinstance(node, ast.AnnAssign) and node.value is not None:
        yield from _values(target_name(node.target), node.value)
    elif isinstance(node, ast.keyword) and node.arg:
        yield from _values(node.arg, node.value)
    elif isinstance(node, ast.Name) and node.id in sglang.ENTRIES:
        yield _entry(node.id)
    elif isinstance(node, ast.Attribute) and node.attr in sglang.ENTRIES:
        yield _entry(node.attr)
    elif isinstance(node, ast.ImportFrom):
        for alias in node.names:
            if alias.name in sglang.ENTRIES:
                yield _entry(alias.name)


def _entry(name: str) -> Choice:
    entry = sglang.ENTRIES[name]
    return entry.kind, entry.name, name


def flag(name: str) -> Choice:
    entry = sglang.FLAGS[name]
    return entry.kind, entry.name, name


def target_name(target: ast.AST) -> str | None:
    """The name an assignment target gives: `x`, `self.x`, `declared["x"]`."""
    if isinstance(target, ast.Name):
        return target.id
    if isinstance(target, ast.Attribute):
        return target.attr
    if (
        isinstance(target, ast.Subscript)
        and isinstance(target.slice, ast.Constant)
        and isinstance(target.slice.value, str)
    ):
        return target.slice.value
    return None


def _values(name: str | None, value: ast.expr) -> Iterator[Choice]:
    kind = entries.field_kind(name) if name else None
    if kind is None or name is None:
        return
    table, prefix = kind
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        yield table, prefix + value.value, name
    elif isinstance(value, ast.IfExp):
        yield from _values(name, value.body)
        yield from _values(name, value.orelse)


def opt_in(
    conditions: Sequence[tuple[ast.expr, bool]], kv_defaults: frozenset[str] = frozenset()
) -> str:
    """The user's flag among the conditions a path needs (test, the truth it needs), or "".
    `kv_defaults`: the KV cache dtypes the module itself gives this GPU for `auto`."""
    for test, needed in conditions:
        found = _user_flag(test, needed, kv_defaults)
        if found:
            return found
    return ""


def _user_flag(test: ast.expr, needed: bool, kv_defaults: frozenset[str] = frozenset()) -> str:
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _user_flag(test.operand, not needed, kv_defaults)
    if isinstance(test, ast.BoolOp):
        if isinstance(test.op, ast.And) == needed:  # every part holds
            for value in test.values:
                found = _user_flag(value, needed, kv_defaults)
                if found:
                    return found
        return ""
    text = _text(test)
    if needed and _names_flag(test):
        return text
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.ops[0], ast.Eq)
        and isinstance(test.comparators[0], ast.Constant)
        and _kv_dtype_named(test.left)
    ):
        # `kv_cache_dtype == "fp8_e4m3"`: the user's --kv-cache-dtype, unless the module gives
        # this GPU that dtype for `auto` itself (0.5.9+ DSA: fp8_e4m3 on major >= 10), or the
        # test is for `auto` itself. A default other than the one compared (a learnable-sink
        # model's bfloat16) is not followed: such models may never reach the test.
        dtype = test.comparators[0].value
        other = ast.Compare(test.left, [ast.NotEq()], test.comparators)
        if dtype == "auto":
            return "" if needed else _text(other)
        if needed and dtype in kv_defaults:
            return ""
        return text if needed else _text(other)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and _backend_named(test.left):
        right = test.comparators[0]
        literal = isinstance(right, ast.Constant) and right.value not in (None, "auto")
        op = test.ops[0]
        if literal and (
            (isinstance(op, ast.Eq) and needed) or (isinstance(op, ast.NotEq) and not needed)
        ):
            return text
        if isinstance(op, ast.In) and needed:
            return text
        if isinstance(right, ast.Constant) and right.value in (None, "auto"):
            is_default = isinstance(op, (ast.Eq, ast.Is))
            return text if is_default != needed else ""
    if isinstance(test, ast.Call) and isinstance(test.func, ast.Attribute):
        method = test.func.attr
        if _backend_named(test.func.value) and method.startswith("is_"):
            default = method == "is_auto"
            return text if default != needed else ""
    return ""


def _names_flag(test: ast.expr) -> bool:
    """An `enable_*` server flag or an `SGLANG_ENABLE_*` variable read (`.get()`)."""
    node: ast.expr = test
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and not node.args:
        node = node.func.value if node.func.attr == "get" else node
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", "")
    return isinstance(name, str) and (
        name.startswith("enable_") or name.startswith("SGLANG_ENABLE_")
    )


def _kv_dtype_named(node: ast.expr) -> bool:
    return last_name(node).endswith("kv_cache_dtype")


def _backend_named(node: ast.expr) -> bool:
    return "backend" in last_name(node)


def _text(node: ast.expr) -> str:
    try:
        text = ast.unparse(node)
    except (ValueError, AttributeError, RecursionError):
        return "a flag"
    return text if len(text) <= 60 else text[:57] + "..."
