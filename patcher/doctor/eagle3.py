"""EAGLE-3 readiness, derived from the target's own code.

The methods the EAGLE workers (and the speculative-decoding modules they import) call on the
target model, and the methods the model runner calls on its model on an EAGLE code path, are
what every generation model class that SGLang registers (`EntryClass` in
`sglang/srt/models/*.py`) must provide; base classes defined inside SGLang count,
torch.nn.Module's own methods do not. Which classes those are is `models`' part.
"""

from __future__ import annotations

import ast
import re
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sglpatch.doctor import chunks
from sglpatch.doctor.source_tree import (
    Source,
    absolute_module,
    chain,
    walk_with_ancestors,
)

# torch.nn.Module's own methods: every model has them through a base outside SGLang.
NN_MODULE_METHODS = frozenset(
    """add_module apply bfloat16 buffers children compile cpu cuda double eval extra_repr float
    forward get_buffer get_parameter get_submodule half load_state_dict modules named_buffers
    named_children named_modules named_parameters parameters register_buffer
    register_forward_hook register_forward_pre_hook register_module register_parameter
    requires_grad_ state_dict to train type zero_grad __call__""".split()  # noqa: SIM905
)


def requirements(source: Source) -> dict[str, tuple[str, ...]]:
    """Methods the EAGLE path calls on the target model, with the places that call them."""
    found: dict[str, list[str]] = {}
    for path, tree in _eagle_worker_files(source):
        lines = _lines_matching(source.text(path), _TARGET_CALL)
        for call, method in _calls(tree, lines, _is_target_model):
            found.setdefault(method, []).append(f"{source.shown(path)}:{call.lineno}")
    executor = source.package_dir / "srt" / "model_executor"
    for path in sorted(executor.rglob("*.py")):
        text = source.text(path)
        if "eagle" not in text.lower() or not (lines := _lines_matching(text, _MODEL_CALL)):
            continue
        # The model runner is thousands of lines: parse only the functions holding the calls.
        chunk = chunks.parse(text.splitlines(), lines)
        parsed: ast.Module | None
        if chunk is not None:
            parsed, wanted, real = chunk.tree, chunk.wanted(lines), chunk.real
        else:
            parsed, wanted, real = source.tree(path), lines, None
        if parsed is None:
            continue
        for call, method in _calls(parsed, wanted, _is_runner_model, within=_on_eagle_path):
            line = real[call.lineno] if real else call.lineno
            found.setdefault(method, []).append(f"{source.shown(path)}:{line}")
    return {
        method: tuple(places)
        for method, places in sorted(found.items())
        if method not in NN_MODULE_METHODS and not method.startswith("_")
    }


_TARGET_CALL = re.compile(r"(?:target_model|model_runner\s*\.\s*model)\s*\.\s*\w+\s*\(")
_MODEL_CALL = re.compile(r"\bmodel\s*\.\s*\w+\s*\(")


def _lines_matching(text: str, pattern: re.Pattern[str]) -> list[int]:
    return sorted({text.count("\n", 0, m.start()) + 1 for m in pattern.finditer(text)})


def _eagle_worker_files(source: Source) -> Iterator[tuple[Path, ast.Module]]:
    """The EAGLE worker modules, and the speculative-decoding modules they import."""
    speculative = source.package_dir / "srt" / "speculative"
    workers = sorted(p for p in speculative.rglob("*.py") if "eagle" in p.name)
    seen: set[Path] = set()
    for path in workers:
        tree = source.tree(path)
        if tree is None:
            continue
        helpers = [
            source.module_file(name)
            for name in _imported_modules(tree, source.dotted(path))
            if name.startswith("sglang.srt.speculative")
        ]
        for candidate in (path, *helpers):
            if candidate is not None and candidate not in seen:
                seen.add(candidate)
                text = source.text(candidate)
                if "target_model" not in text and "target_worker" not in text:
                    continue
                candidate_tree = source.tree(candidate)
                if candidate_tree is not None:
                    yield candidate, candidate_tree


def _imported_modules(tree: ast.Module, module: str) -> Iterator[str]:
    for node in _statements(tree):
        if isinstance(node, ast.ImportFrom):
            base = absolute_module(node, module)
            if base:
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


def _statements(tree: ast.Module) -> Iterator[ast.AST]:
    """`ast.walk`'s order without entering expressions: imports are statements, and expressions
    are most of a module's nodes."""
    queue: deque[ast.AST] = deque([tree])
    while queue:
        node = queue.popleft()
        queue.extend(c for c in ast.iter_child_nodes(node) if not isinstance(c, _NO_STATEMENTS))
        yield node


_NO_STATEMENTS = (ast.expr, ast.expr_context, ast.boolop, ast.operator, ast.unaryop, ast.cmpop)


def _is_target_model(receiver: ast.expr) -> bool:
    names = chain(receiver)
    return names[-3:] == ["target_worker", "model_runner", "model"] or names[-1:] == [
        "target_model"
    ]


def _is_runner_model(receiver: ast.expr) -> bool:
    names = chain(receiver)
    return names[-1:] == ["model"] and "draft_model_runner" not in names


def _on_eagle_path(ancestors: Sequence[ast.AST]) -> bool:
    return any(
        isinstance(node, ast.If) and "eagle" in ast.unparse(node.test).lower() for node in ancestors
    )


def _calls(
    tree: ast.Module,
    lines: Sequence[int],
    receiver_matches: Callable[[ast.expr], bool],
    within: Callable[[Sequence[ast.AST]], bool] | None = None,
) -> Iterator[tuple[ast.Call, str]]:
    """Calls `<receiver>.<method>(...)` on `lines`, not made optional by a hasattr() test."""
    for call, ancestors in walk_with_ancestors(tree, lines):
        if not isinstance(call, ast.Call) or not isinstance(call.func, ast.Attribute):
            continue
        method = call.func.attr
        if not receiver_matches(call.func.value):
            continue
        if within is not None and not within(ancestors):
            continue
        if _guarded(ancestors, method):
            continue
        yield call, method


def _guarded(ancestors: Sequence[ast.AST], method: str) -> bool:
    """Inside `if hasattr(x, "method")`: the caller copes when the method is missing."""
    for node in ancestors:
        if isinstance(node, (ast.If, ast.IfExp, ast.BoolOp)):
            for part in ast.walk(node.test if isinstance(node, (ast.If, ast.IfExp)) else node):
                if (
                    isinstance(part, ast.Call)
                    and isinstance(part.func, ast.Name)
                    and part.func.id == "hasattr"
                    and len(part.args) == 2
                    and isinstance(part.args[1], ast.Constant)
                    and part.args[1].value == method
                    and not _negated(part, node)
                ):
                    return True
    return False


def _negated(call: ast.Call, within: ast.AST) -> bool:
    return any(
        isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not) and node.operand is call
        for node in ast.walk(within)
    )
