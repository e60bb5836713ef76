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
import functools
import re
from collections.abc import Callable, Collection, Iterator, Sequence
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor.facts.sglang import DRAFT_CLASS
from sglpatch.doctor.read import chunks
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source, from_imports
from sglpatch.errors import UsageError


class _Summary:
    """One module's classes, imports and EntryClass, read from its text, not parsed.

    Models modules are the largest part of SGLang; parsing them all took doctor seconds. Class
    headers are found up front; a class's members (the names its body defines at its own
    indentation) and attributes (the `self.x =` of its `__init__`) are read when asked for,
    which is for the registered classes and their bases, not the layers around them.
    """

    def __init__(self, text: str, module: str) -> None:
        self.text = text
        self.module = module
        # name -> (base names, offset where its body starts); where it ends is found when read
        self.classes: dict[str, tuple[tuple[str, ...], int]] = {}
        for match in _starts(text, _CLASS, "class"):
            bases = tuple(
                name
                for base in (match.group(2) or "").split(",")
                if (name := base.strip()).isidentifier()
            )
            self.classes[match.group(1)] = (bases, match.end())
        entry = next(_starts(text, _ENTRY, "EntryClass"), None)
        self.entry: tuple[str, ...] = ()
        if entry:
            self.entry = tuple(n for n in re.findall(r"\w+", entry.group(1)) if n.isidentifier())
        self._imports: dict[str, tuple[str, str]] | None = None
        self._read: dict[str, tuple[frozenset[str], frozenset[str]]] = {}

    @property
    def imports(self) -> dict[str, tuple[str, str]]:
        """local name -> (absolute module, name there)."""
        if self._imports is None:
            self._imports = {
                local: (base, name)
                for base, names in from_imports(self.text, self.module)
                for name, local in names
            }
        return self._imports

    def members(self, name: str) -> frozenset[str]:
        return self._class(name)[0]

    def attributes(self, name: str) -> frozenset[str]:
        return self._class(name)[1]

    def _class(self, name: str) -> tuple[frozenset[str], frozenset[str]]:
        if name not in self._read:
            start = self.classes[name][1]
            after = _TOP_LEVEL.search(self.text, start)
            end = after.start() if after else len(self.text)
            # Each line of the body after a "\n", the first too: `_at_indent`'s patterns are
            # led by one, which the regex engine skips ahead to.
            body = "\n" + self.text[start:end]
            indent = _BODY_INDENT.search(body, 1)
            if indent is None:
                self._read[name] = (frozenset(), frozenset())
            else:
                member, init, next_member = _at_indent(indent.group(1))
                members = frozenset(a or b for a, b in member.findall(body))
                attributes: set[str] = set()
                for header in init.finditer(body):
                    after = next_member.search(body, header.end())
                    stop = after.start() if after else len(body)
                    attributes.update(_SELF.findall(body, header.end(), stop))
                self._read[name] = (members, frozenset(attributes))
        return self._read[name]


def summarize(data: bytes, module: str) -> _Summary:
    return _Summary(data.decode("utf-8", errors="replace"), module)


def _starts(text: str, pattern: re.Pattern[str], word: str) -> Iterator[re.Match[str]]:
    """`pattern` matched at each line that starts with `word`: str.find is far faster than a
    regex anchored at every line start."""
    if text.startswith(word) and (match := pattern.match(text)):
        yield match
    found = text.find("\n" + word) + 1
    while found:
        if match := pattern.match(text, found):
            yield match
        found = text.find("\n" + word, found) + 1


_CLASS = re.compile(r"class\s+(\w+)\s*(?:\(([^)]*)\))?\s*:")
_ENTRY = re.compile(r"EntryClass\s*=\s*(\[[^\]]*\]|\([^)]*\)|[^\n]*)")
# The end of a class: the next line of code at column 0 (not a comment or a closing bracket).
_TOP_LEVEL = re.compile(r"\n(?=[^\s#)\]}])")
_BODY_INDENT = re.compile(r"\n([ \t]+)[^\s#]")


@functools.cache
def _at_indent(indent: str) -> tuple[re.Pattern[str], re.Pattern[str], re.Pattern[str]]:
    """At a class body's own indentation: a member (a def, or a name assigned, annotated or
    not), the `__init__` header, and the next line of code (where a member ends). Each is led
    by the "\n" before the line, not by `^`: a multiline `^` is tried at every offset, several
    times slower over a class body."""
    at = "\n" + re.escape(indent)
    return (
        re.compile(rf"{at}(?:(?:async\s+)?def\s+(\w+)|(\w+)\s*(?::[^=\n]*)?=(?!=))"),
        re.compile(rf"{at}def __init__\b"),
        re.compile(rf"{at}(?=[^\s#)\]}}])"),
    )


_SELF = re.compile(r"self\.(\w+)\s*(?::[^=\n]*)?=(?!=)")


def _summarize_path(source: Source, job: tuple[Path, str]) -> tuple[Path, _Summary | None]:
    path, module = job
    data = source.read(path)  # one that cannot be read is noted there
    return path, None if data is None else summarize(data, module)


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
            self.summaries[path] = _summarize_path(self.source, (path, self.source.dotted(path)))[1]
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
        return self._collect(path, name, _Summary.members, set())

    def attributes(self, path: Path, name: str) -> set[str]:
        return self._collect(path, name, _Summary.attributes, set())

    def _collect(
        self,
        path: Path,
        name: str,
        field: Callable[[_Summary, str], frozenset[str]],
        seen: set[tuple[Path, str]],
    ) -> set[str]:
        summary = self.summary(path)
        if summary is None or (path, name) in seen or name not in summary.classes:
            return set()
        seen.add((path, name))
        found = set(field(summary, name))
        for base in summary.classes[name][0]:
            resolved = self.resolve(path, base)
            if resolved is not None:
                found |= self._collect(*resolved, field, seen)
        return found


class Registered(NamedTuple):
    path: Path  # the module defining the class
    name: str
    listed_in: Path  # the module whose EntryClass lists it
    excluded: str | None  # why it is no EAGLE-3 target, if it is not


MODELS = "sglang/srt/models/"  # the models folder, as doctor shows it


def unread(source: Source, files: Collection[str], found: bool) -> tuple[str, ...]:
    """What doctor could not read of the model `--model` asked for: its modules (`files`,
    sglang/...), or, when no class of it was `found`, any models module or folder: it may be
    there. Its classes and imports, and so the patches that concern it, are then unknown."""
    return tuple(s for s in source.not_judged if s in files or (not found and s.startswith(MODELS)))


def models_folder(source: Source) -> Path:
    return source.package_dir / "srt" / "models"


def load_models(source: Source, paths: Sequence[Path]) -> Models:
    jobs = [(path, source.dotted(path)) for path in paths]
    # Reading lines is cheap enough that a process pool would cost more than it saves.
    return Models(source, dict(_summarize_path(source, job) for job in jobs))


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
            elif name in drafts or DRAFT_CLASS.search(name):
                excluded = "a draft model (NextN/MTP/EAGLE)"
            else:
                attributes = models.attributes(*where)
                if "pooler" in attributes and "logits_processor" not in attributes:
                    excluded = "pools hidden states (embedding, reward or classification)"
            found.append(Registered(where[0], name, path, excluded))
    return found


_REGISTRY_LINES = re.compile(r"def is_generation_model\b|architectures.*=\s*[\"']")


def _registry(source: Source) -> tuple[set[str], set[str]]:
    """Architectures SGLang calls non-generative, and the draft ones it rewrites to."""
    config = source.package_dir / "srt" / "configs" / "model_config.py"
    try:
        tree = (
            chunks.around(source.text(config), _REGISTRY_LINES) if source.is_file(config) else None
        )
    except TOO_DEEP:
        source.note(source.shown(config), TOO_DEEP_WHY)
        tree = None
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
    UsageError with the closest stems and class names for a near miss. Where a models module or
    the folder could not be read (noted), the name may be in it: no modules, and the name kept,
    so that the model is not judged (a near miss cannot be told from it).
    """
    if not is_model_name(wanted):
        raise UsageError(
            f"--model {shown_name(wanted)}: not a models module or architecture name (at most "
            f"{_NAME_LIMIT} letters, digits and `_-.`)"
        )
    folder = models_folder(source)
    stem = folder / f"{wanted}.py"
    if "/" not in wanted and source.is_file(stem):
        return [stem], None
    needle = wanted.encode()
    candidates = [
        path
        for path in source.python_files(folder)
        if needle in (data := source.read(path) or b"") and b"EntryClass" in data
    ]
    if candidates:
        models = load_models(source, candidates)
        hits = [r for r in registered(source, models, candidates) if r.name == wanted]
        if hits:
            return sorted({r.listed_in for r in hits}), {wanted}
    if any(name.startswith(MODELS) for name in source.not_judged):
        return [], {wanted}
    raise UsageError(
        f"--model {wanted}: no models module or architecture of that name"
        + _suggest(source, wanted)
        + _hub_hint(wanted)
    )


def _hub_hint(wanted: str) -> str:
    """No module or class has a name that is not an identifier (`GLM-5.3-Flash`): most likely a
    Hugging Face model's; say how doctor takes one."""
    if wanted.isidentifier():
        return ""
    return (
        f"; {wanted} looks like a Hugging Face model name: give its id as ORG/NAME (its "
        "config.json is read in the local Hugging Face cache) or pass --model-path DIR"
    )


_NAME_LIMIT = 200
_MODEL_NAME = re.compile(r"[A-Za-z0-9_.\-]+")


def is_model_name(name: str) -> bool:
    """A name a models module or an architecture can have (`kimi_k25`, `kimi-k2.5`, a class):
    nothing that cannot be a file name, a surrogate or a 300-character path component."""
    return 0 < len(name) <= _NAME_LIMIT and bool(_MODEL_NAME.fullmatch(name) or name.isidentifier())


def shown_name(name: str) -> str:
    """A name as an error line shows it: printable, and short."""
    text = ascii(name[:_NAME_LIMIT])[1:-1]
    return text[:60] + f"... ({len(name):,} characters)" if len(text) > 60 else text


def _suggest(source: Source, wanted: str) -> str:
    folder = models_folder(source)
    paths = source.python_files(folder)
    names = {p.stem for p in paths}
    models = load_models(source, paths)
    names |= {r.name for r in registered(source, models, paths)}
    key = {_normal(n): n for n in sorted(names)}
    wanted_key = _normal(wanted)
    import difflib  # a near miss only

    close = difflib.get_close_matches(wanted_key, list(key), n=4, cutoff=0.6)
    # `kimi-k2.5` is the start of KimiK25ForConditionalGeneration: name those too.
    close += [k for k in key if wanted_key and k.startswith(wanted_key) and k not in close][:4]
    return f"; did you mean {', '.join(key[c] for c in close)}?" if close else ""


def _normal(name: str) -> str:
    """`kimi-k2.5`, `kimi_k25` and `KimiK25` compare alike."""
    return re.sub(r"[^0-9a-z]", "", name.lower())
