"""The generation models an SGLang tree registers: the EAGLE-3 targets doctor checks.

Every class listed in `EntryClass` in `sglang/srt/models/*.py`, with its members and those of
the base classes defined inside SGLang, read from the modules' lines, not parsed.

Only generation models can be EAGLE-3 targets. SGLang itself says which registered classes are
not: the architectures `is_generation_model()` in `srt/configs/model_config.py` rejects
(embedding, reward, classification, CLIP/BERT), the draft architectures that file rewrites a
checkpoint to (NextN/MTP) and, by name, the EAGLE draft models; and a class whose own or
inherited `__init__` sets up a `pooler` and no `logits_processor` produces embeddings or scores,
not tokens.
"""

from __future__ import annotations

import ast
import difflib
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor.source_tree import Source, absolute_module
from sglpatch.errors import UsageError


@dataclass(frozen=True)
class _Summary:
    """What model resolution needs from one module: small enough to send between processes."""

    # name -> (base names, members, attributes its methods set on self)
    classes: dict[str, tuple[tuple[str, ...], frozenset[str], frozenset[str]]]
    imports: dict[str, tuple[str, str]]  # local name -> (absolute module, name there)
    entry: tuple[str, ...]


def summarize(data: bytes, module: str) -> _Summary | None:
    """Classes, imports and EntryClass of a models module, read from its lines, not parsed.

    Models modules are the largest part of SGLang; parsing them all took doctor seconds. A class
    is its header and the lines indented under it: members are the names defined at the body's
    own indentation, attributes the `self.x =` in its `__init__`.
    """
    text = data.decode("utf-8", errors="replace")
    lines = text.splitlines()
    classes = {}
    start, counted = 0, 0
    for match in _CLASS.finditer(text):
        start += text.count("\n", counted, match.start())  # from the previous header on
        counted = match.start()
        bases = tuple(
            name
            for base in (match.group(2) or "").split(",")
            if (name := base.strip()).isidentifier()
        )
        members, attributes = _members(_block(lines, start))
        classes[match.group(1)] = (bases, frozenset(members), frozenset(attributes))
    imports = {}
    for match in _FROM.finditer(text):
        level = len(match.group(1)) - len(match.group(1).lstrip("."))
        node = ast.ImportFrom(module=match.group(1).lstrip(".") or None, names=[], level=level)
        base = absolute_module(node, module)
        if not base:
            continue
        for item in match.group(2).strip("()").replace("\n", " ").split(","):
            parts = item.split("#")[0].split()
            if len(parts) == 1 and parts[0].isidentifier():
                imports[parts[0]] = (base, parts[0])
            elif len(parts) == 3 and parts[1] == "as":
                imports[parts[2]] = (base, parts[0])
    entry = _ENTRY.search(text)
    names: tuple[str, ...] = ()
    if entry:
        names = tuple(n for n in re.findall(r"\w+", entry.group(1)) if n.isidentifier())
    return _Summary(classes, imports, names)


_CLASS = re.compile(r"^class\s+(\w+)\s*(?:\(([^)]*)\))?\s*:", re.MULTILINE)
_FROM = re.compile(r"^[ \t]*from\s+([.\w]+)\s+import\s+(\([^)]*\)|[^\n]*)", re.MULTILINE)
_ENTRY = re.compile(r"^EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[^\n]*)", re.MULTILINE)
_MEMBER = re.compile(r"(?:async\s+)?def\s+(\w+)|(\w+)\s*(?::[^=]*)?=(?!=)")
_SELF = re.compile(r"self\.(\w+)\s*(?::[^=]*)?=(?!=)")


def _block(lines: Sequence[str], header: int) -> list[str]:
    """The lines of the class whose header is at `header`, up to the next top-level code."""
    body = []
    for line in lines[header + 1 :]:
        if line and not line[0].isspace() and not line.startswith(("#", ")", "]", "}")):
            break
        body.append(line)
    return body


def _members(body: Sequence[str]) -> tuple[list[str], list[str]]:
    """The names a class body defines at its own indentation, and the `self.x =` of its
    `__init__`, in one pass over the body."""
    members: list[str] = []
    attributes: list[str] = []
    indent = None
    for line in body:
        stripped = line.lstrip()
        if stripped and not stripped.startswith("#"):
            indent = len(line) - len(stripped)
            break
    if indent is None:
        return members, attributes
    inside = False
    for line in body:
        stripped = line.lstrip()
        level = len(line) - len(stripped)
        if level == indent and indent and stripped:
            match = _MEMBER.match(line, indent)
            if match:
                members.append(match.group(1) or match.group(2))
        if not stripped or stripped[0] == "#":
            continue
        if level == indent and not stripped.startswith((")", "]", "}")):
            inside = stripped.startswith("def __init__")
        elif inside:
            attributes += _SELF.findall(stripped)
    return members, attributes


def _summarize_path(job: tuple[Path, str]) -> tuple[Path, _Summary | None]:
    path, module = job
    try:
        return path, summarize(path.read_bytes(), module)
    except OSError:
        return path, None


class Models:
    """Class lookup across SGLang modules, from summaries made once per module."""

    def __init__(self, source: Source, summaries: dict[Path, _Summary | None]) -> None:
        self.source = source
        self.summaries = summaries

    def with_file(self, path: Path, data: bytes) -> Models:
        """The same lookup with one module's bytes replaced (a patch applied in memory)."""
        return Models(
            self.source, {**self.summaries, path: summarize(data, self.source.dotted(path))}
        )

    def summary(self, path: Path) -> _Summary | None:
        if path not in self.summaries:
            self.summaries[path] = _summarize_path((path, self.source.dotted(path)))[1]
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

    def members(self, path: Path, name: str) -> set[str]:
        return self._collect(path, name, 1, set())

    def attributes(self, path: Path, name: str) -> set[str]:
        return self._collect(path, name, 2, set())

    def _collect(self, path: Path, name: str, field: int, seen: set[tuple[Path, str]]) -> set[str]:
        summary = self.summary(path)
        if summary is None or (path, name) in seen or name not in summary.classes:
            return set()
        seen.add((path, name))
        info = summary.classes[name]
        found = set(info[field])
        for base in info[0]:
            resolved = self.resolve(path, base)
            if resolved is not None:
                found |= self._collect(*resolved, field, seen)
        return found


class Registered(NamedTuple):
    path: Path  # the module defining the class
    name: str
    listed_in: Path  # the module whose EntryClass lists it
    excluded: str | None  # why it is no EAGLE-3 target, if it is not


def models_folder(source: Source) -> Path:
    return source.package_dir / "srt" / "models"


def load_models(source: Source, paths: Sequence[Path]) -> Models:
    jobs = [(path, source.dotted(path)) for path in paths]
    # Reading lines is cheap enough that a process pool would cost more than it saves.
    return Models(source, dict(_summarize_path(job) for job in jobs))


def registered(source: Source, models: Models, paths: Sequence[Path]) -> list[Registered]:
    """Every class the given models modules list in EntryClass, with why it is excluded."""
    not_generation, drafts = _registry(source)
    found = []
    for path in paths:
        summary = models.summary(path)
        for listed in summary.entry if summary else ():
            where = models.resolve(path, listed)
            if where is None:
                continue
            name = where[1]
            excluded = None
            if name in not_generation:
                excluded = "not a generation model (SGLang's is_generation_model)"
            elif name in drafts or _DRAFT.search(name):
                excluded = "a draft model (NextN/MTP/EAGLE)"
            else:
                attributes = models.attributes(*where)
                if "pooler" in attributes and "logits_processor" not in attributes:
                    excluded = "pools hidden states (embedding, reward or classification)"
            found.append(Registered(where[0], name, path, excluded))
    return found


_DRAFT = re.compile(r"(?:NextN|MTP|Eagle\d*)$")


def _registry(source: Source) -> tuple[set[str], set[str]]:
    """Architectures SGLang calls non-generative, and the draft ones it rewrites to."""
    config = source.package_dir / "srt" / "configs" / "model_config.py"
    tree = source.tree(config) if config.is_file() else None
    not_generation: set[str] = set()
    drafts: set[str] = set()
    for node in ast.walk(tree) if tree else ():
        if isinstance(node, ast.FunctionDef) and node.name == "is_generation_model":
            not_generation |= {
                c.value
                for c in ast.walk(node)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
        elif (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
            and any("architectures" in ast.unparse(t) for t in node.targets)
        ):
            drafts.add(node.value.value)
    return not_generation, drafts


def find_model(source: Source, wanted: str) -> tuple[list[Path], set[str] | None]:
    """The models modules to read for `--model`: a file stem, or an architecture name.

    Returns the modules and, for an architecture name, the class names to keep. Raises
    UsageError with the closest stems and class names for a near miss.
    """
    folder = models_folder(source)
    stem = folder / f"{wanted}.py"
    if "/" not in wanted and stem.is_file():
        return [stem], None
    needle = wanted.encode()
    candidates = [
        path
        for path in sorted(folder.glob("*.py"))
        if needle in (data := _read(path)) and b"EntryClass" in data
    ]
    if candidates:
        models = load_models(source, candidates)
        hits = [r for r in registered(source, models, candidates) if r.name == wanted]
        if hits:
            return sorted({r.listed_in for r in hits}), {wanted}
    raise UsageError(
        f"--model {wanted}: no models module or architecture of that name{_suggest(source, wanted)}"
    )


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError:
        return b""


def _suggest(source: Source, wanted: str) -> str:
    folder = models_folder(source)
    paths = sorted(folder.glob("*.py"))
    names = {p.stem for p in paths}
    models = load_models(source, paths)
    names |= {r.name for r in registered(source, models, paths)}
    key = {_normal(n): n for n in sorted(names)}
    wanted_key = _normal(wanted)
    close = difflib.get_close_matches(wanted_key, list(key), n=4, cutoff=0.6)
    # `kimi-k2.5` is the start of KimiK25ForConditionalGeneration: name those too.
    close += [k for k in key if wanted_key and k.startswith(wanted_key) and k not in close][:4]
    return f"; did you mean {', '.join(key[c] for c in close)}?" if close else ""


def _normal(name: str) -> str:
    """`kimi-k2.5`, `kimi_k25` and `KimiK25` compare alike."""
    return re.sub(r"[^0-9a-z]", "", name.lower())
