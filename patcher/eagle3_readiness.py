"""EAGLE-3 readiness, derived from the target's own code.

The methods the EAGLE workers (and the speculative-decoding modules they import) call on the
target model, and the methods the model runner calls on its model on an EAGLE code path, are
what every model class that SGLang registers (`EntryClass` in `sglang/srt/models/*.py`) must
provide; base classes defined inside SGLang count, torch.nn.Module's own methods do not.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from sglpatch.source_tree import (
    Source,
    absolute_module,
    chain,
    parallel,
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
        if (parsed := source.tree(path)) is None:
            continue
        for call, method in _calls(parsed, lines, _is_runner_model, within=_on_eagle_path):
            found.setdefault(method, []).append(f"{source.shown(path)}:{call.lineno}")
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
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            base = absolute_module(node, module)
            if base:
                yield base
                yield from (f"{base}.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)


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


# --- registered models ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Summary:
    """What model resolution needs from one module: small enough to send between processes."""

    classes: dict[str, tuple[tuple[str, ...], frozenset[str]]]  # name -> (base names, members)
    imports: dict[str, tuple[str, str]]  # local name -> (absolute module, name there)
    entry: tuple[str, ...]


def _summarize(path: Path, module: str) -> _Summary | None:
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    classes = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef):
            bases = tuple(b.id for b in node.bases if isinstance(b, ast.Name))
            classes[node.name] = (bases, frozenset(_members(node)))
    imports = {}
    for node in _top_level(tree.body):
        if isinstance(node, ast.ImportFrom) and (base := absolute_module(node, module)):
            for alias in node.names:
                imports[alias.asname or alias.name] = (base, alias.name)
    return _Summary(classes, imports, tuple(_entry_classes(tree)))


def _top_level(body: Sequence[ast.stmt]) -> Iterator[ast.stmt]:
    """Module-level statements, including those inside top-level `try:` and `if` blocks."""
    for node in body:
        yield node
        if isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _top_level(block)
        elif isinstance(node, ast.If):
            yield from _top_level(node.body)
            yield from _top_level(node.orelse)


def _members(cls: ast.ClassDef) -> Iterator[str]:
    for node in cls.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            yield node.name
        elif isinstance(node, ast.Assign):
            yield from (t.id for t in node.targets if isinstance(t, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            yield node.target.id


def _entry_classes(tree: ast.Module) -> list[str]:
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "EntryClass" for t in node.targets
        ):
            value = node.value
            items = value.elts if isinstance(value, (ast.List, ast.Tuple)) else [value]
            return [item.id for item in items if isinstance(item, ast.Name)]
    return []


class _Models:
    """Class lookup across SGLang modules, from summaries made once per module."""

    def __init__(self, source: Source, summaries: dict[Path, _Summary | None]) -> None:
        self.source = source
        self.summaries = summaries

    def summary(self, path: Path) -> _Summary | None:
        if path not in self.summaries:
            self.summaries[path] = _summarize(path, self.source.dotted(path))
        return self.summaries[path]

    def resolve(self, path: Path, name: str, depth: int = 0) -> tuple[Path, str] | None:
        """Where class `name`, as seen from module `path`, is defined inside SGLang."""
        summary = self.summary(path)
        if summary is None or depth > 20:
            return None
        if name in summary.classes:
            return path, name
        if name in summary.imports:
            module, original = summary.imports[name]
            target = self.source.module_file(module)
            if target is not None and target != path:
                return self.resolve(target, original, depth + 1)
        return None

    def members(self, path: Path, name: str, seen: set[tuple[Path, str]]) -> set[str]:
        summary = self.summary(path)
        if summary is None or (path, name) in seen or name not in summary.classes:
            return set()
        seen.add((path, name))
        bases, members = summary.classes[name]
        found = set(members)
        for base in bases:
            resolved = self.resolve(path, base)
            if resolved is not None:
                found |= self.members(*resolved, seen)
        return found


def registered_models(source: Source, only: str | None) -> Iterator[tuple[Path, str, set[str]]]:
    """(module, class, members it has) for every class a models module lists in EntryClass."""
    folder = source.package_dir / "srt" / "models"
    paths = [folder / f"{only}.py"] if only else sorted(folder.glob("*.py"))
    paths = [p for p in paths if p.is_file()]
    models = _Models(source, dict(parallel(_summarize_file, paths, source)))
    for path in paths:
        summary = models.summary(path)
        for name in summary.entry if summary else ():
            found = models.resolve(path, name)
            if found is not None:
                yield found[0], found[1], models.members(*found, set())


def _summarize_file(args: tuple[Path, str]) -> tuple[Path, _Summary | None]:
    path, module = args
    return path, _summarize(path, module)
