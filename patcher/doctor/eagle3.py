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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from sglpatch.doctor.read import chunks
from sglpatch.doctor.read.source_tree import (
    TOO_DEEP,
    TOO_DEEP_WHY,
    Source,
    chain,
    imported_modules,
    walk_with_ancestors,
)
from sglpatch.doctor.report import Blocker, ModelReport, Origin

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
    for path, text in _eagle_worker_files(source):
        for line, method in _judged(source, path, _calls_in(text, _TARGET_CALL, _is_target_model)):
            found.setdefault(method, []).append(f"{source.shown(path)}:{line}")
    executor = source.package_dir / "srt" / "model_executor"
    for path in source.python_files(executor, deep=True):
        text = source.text(path)
        if "eagle" not in text.lower():
            continue
        calls = _calls_in(text, _MODEL_CALL, _is_runner_model, _on_eagle_path)
        for line, method in _judged(source, path, calls):
            found.setdefault(method, []).append(f"{source.shown(path)}:{line}")
    return {
        method: tuple(places)
        for method, places in sorted(found.items())
        if method not in NN_MODULE_METHODS and not method.startswith("_")
    }


def _judged(source: Source, path: Path, calls: Iterator[tuple[int, str]]) -> list[tuple[int, str]]:
    """The calls of one file; none, and the file noted as not judged, when it cannot be parsed."""
    try:
        return list(calls)
    except TOO_DEEP:
        source.note(source.shown(path), TOO_DEEP_WHY)
        return []


_TARGET_CALL = re.compile(r"(?:target_model|model_runner\s*\.\s*model)\s*\.\s*\w+\s*\(")
# `\bmodel` as a lookbehind after the literal: led by the literal, the search skips ahead to each
# `model` (a leading `\b` is tried at every offset of the model runner's 100 kB, 10x slower).
_MODEL_CALL = re.compile(r"model(?<!\wmodel)\s*\.\s*\w+\s*\(")


def _calls_in(
    text: str,
    pattern: re.Pattern[str],
    receiver_matches: Callable[[ast.expr], bool],
    within: Callable[[Sequence[ast.AST]], bool] | None = None,
) -> Iterator[tuple[int, str]]:
    """(line, method) of the calls on lines matching `pattern`. The model runner and the
    workers are thousands of lines: only the functions holding such lines are parsed."""
    lines = chunks.matching_lines(text, pattern)
    if not lines:
        return
    chunk = chunks.parse(text.splitlines(), lines)
    if chunk is not None:
        tree, wanted, real = chunk.tree, chunk.wanted(lines), chunk.real
    else:
        try:
            tree, wanted, real = ast.parse(text), lines, list(range(text.count("\n") + 2))
        except (SyntaxError, ValueError):
            return
    for call, method in _calls(tree, wanted, receiver_matches, within):
        yield real[call.lineno], method


def _eagle_worker_files(source: Source) -> Iterator[tuple[Path, str]]:
    """The EAGLE worker modules, and the speculative-decoding modules they import."""
    speculative = source.package_dir / "srt" / "speculative"
    workers = [p for p in source.python_files(speculative, deep=True) if "eagle" in p.name]
    seen: set[Path] = set()
    for path in workers:
        text = source.text(path)
        helpers = [
            source.module_file(name)
            for name in imported_modules(text, source.dotted(path))
            if name.startswith("sglang.srt.speculative")
        ]
        for candidate in (path, *helpers):
            if candidate is not None and candidate not in seen:
                seen.add(candidate)
                candidate_text = text if candidate == path else source.text(candidate)
                if "target_model" in candidate_text or "target_worker" in candidate_text:
                    yield candidate, candidate_text


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


def missing_methods(reports: Sequence[ModelReport]) -> list[Blocker]:
    """The EAGLE-3 methods the models asked for lack, as the report's blockers."""
    return [
        Blocker(
            f"EAGLE-3 cannot start: {r.name} lacks {', '.join(r.missing)}",
            r.name,
            r.fixed_by,
            origin=Origin.MODEL,
        )
        for r in reports
        if r.missing
    ]
