"""Finding patches: every `Patch` subclass in the modules of `sglpatch.patches` (one per module)."""

from __future__ import annotations

import importlib
import importlib.util
import pkgutil
import re
import sys
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import ModuleType

from packaging.version import InvalidVersion, Version

from sglpatch import entry_points, plugin_stdout
from sglpatch.errors import CatalogueError, interrupted, raised
from sglpatch.patch import RUNTIMES, ByRelease, Concerns, Effect, Patch, blame, path_problem

__all__ = ["CatalogueError", "load", "patch_in", "validate"]

ENTRY_POINTS = "sglpatch.patches"


def patch_in(module: ModuleType) -> type[Patch]:
    """The one concrete `Patch` subclass a patch module defines."""
    found = [
        obj
        for obj in vars(module).values()
        # Modules first: touching a lazily imported one (libcst) would load it.
        if not isinstance(obj, ModuleType)
        and isinstance(obj, type)
        and issubclass(obj, Patch)
        and obj.__module__ == module.__name__
        and not getattr(obj, "__abstractmethods__", None)
    ]
    if len(found) != 1:
        raise CatalogueError(f"{module.__name__} defines {len(found)} patches; expected one")
    return found[0]


def builtin_modules() -> list[ModuleType]:
    package = importlib.import_module("sglpatch.patches")
    return [
        importlib.import_module(f"{package.__name__}.{info.name}")
        for info in pkgutil.iter_modules(package.__path__)
        if not info.name.startswith("_")
    ]


def load(
    catalog_dir: Path | None = None, *, modules: Iterable[tuple[ModuleType, str]] | None = None
) -> list[Patch]:
    """Instantiate the catalogue, checking each declaration; sorted by id.

    Patches come from `sglpatch.patches`, from installed packages' `sglpatch.patches` entry
    points, and from the modules in `catalog_dir`; each remembers where it came from.
    """
    if modules is None:
        modules = [(m, "built-in") for m in builtin_modules()]
        modules += plugin_modules()
        if catalog_dir is not None:
            modules += directory_modules(catalog_dir)
    patches = []
    for module, origin in modules:
        cls = patch_in(module)
        with _plugin_code(f"cannot create patch {module.__name__}.{cls.__name__} ({origin})"):
            patch = cls()
        patch.origin = origin
        patches.append(patch)
    seen: dict[str, str] = {}
    for patch in patches:
        validate(patch)
        if patch.id in seen:
            raise CatalogueError(
                f"two patches use the id {patch.id!r} ({seen[patch.id]} and {patch.origin})"
            )
        seen[patch.id] = patch.origin
    return sorted(patches, key=lambda p: p.id)


def plugin_modules() -> list[tuple[ModuleType, str]]:
    """Modules that installed packages declare in the `sglpatch.patches` entry-point group."""
    found = []
    for point in entry_points.declared(ENTRY_POINTS):
        origin = f"plugin {point.distribution}"
        module_name = point.module
        with _plugin_code(f"cannot load {origin} ({point.value})"):
            if module_name is None:
                raise CatalogueError("it names no module")
            module = importlib.import_module(module_name)
        found.append((module, origin))
    return found


def directory_modules(folder: Path) -> list[tuple[ModuleType, str]]:
    """Every `*.py` in `folder` (not starting with `_`), loaded as a patch module."""
    if not folder.is_dir():
        raise CatalogueError(f"--catalog {folder}: not a directory")
    found = []
    for path in sorted(folder.glob("*.py")):
        if path.name.startswith("_"):
            continue
        name = f"sglpatch_catalog_{path.stem}"
        spec = importlib.util.spec_from_file_location(name, path)
        if spec is None or spec.loader is None:
            raise CatalogueError(f"cannot load {path}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        try:
            with _plugin_code(f"cannot load {path}"):
                spec.loader.exec_module(module)
        except CatalogueError:
            del sys.modules[name]
            raise
        found.append((module, str(folder)))
    return found


@contextmanager
def _plugin_code(failure: str) -> Iterator[None]:
    """Run a plugin module's own code (its import, its patch's `__init__`): what it prints goes
    to stderr (stdout may have to be one JSON object), and whatever it raises but Ctrl-C,
    `SystemExit` too, is `failure`: a plugin never ends sglpatch."""
    try:
        with plugin_stdout.to_stderr():
            yield
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        if interrupted(error):  # a Ctrl-C that Python turned into another error
            raise KeyboardInterrupt from error
        raise _keeping_cause(f"{failure}: {raised(error)}") from error


def _keeping_cause(message: str) -> CatalogueError:
    """A one-line error whose traceback (the plugin's own) the CLI keeps in the crash log."""
    import traceback

    error = CatalogueError(message)
    error.details = traceback.format_exc()
    return error


def _probe_releases(patch: Patch) -> list[Version]:
    """The releases named in a patch's `tested` specifiers: where its target_file is checked."""
    found = []
    for spec in getattr(type(patch), "tested", ()):
        try:
            found.append(Version(spec.version.removesuffix(".*")))
        except (InvalidVersion, AttributeError):
            continue
    return found


def validate(patch: Patch) -> None:
    cls = type(patch)
    problems = []
    if (
        not getattr(cls, "id", "")
        or not cls.id.replace("-", "").isalnum()
        or cls.id != cls.id.lower()
    ):
        problems.append("id must be lower-case letters, digits and dashes")
    if not getattr(cls, "description", "") or "\n" in cls.description:
        problems.append("description must be one line")
    if not getattr(cls, "symptom", "") or "\n" in cls.symptom:
        problems.append("symptom must be one line: what a user sees without the patch")
    if not str(getattr(cls, "tested", "")):
        problems.append("tested must be a non-empty specifier set")
    if cls.fixed_upstream_in is not None and not isinstance(cls.fixed_upstream_in, Version):
        problems.append("fixed_upstream_in must be a Version")
    if not (cls.__doc__ or "").strip() or not (cls.__module__ and _module_doc(cls)):
        problems.append("the class and its module need docstrings saying why it exists")
    problems += _concerns_problems(getattr(cls, "concerns", None))
    if not _names(getattr(cls, "unreached_on_12", ()), _CLASS_NAME):
        problems.append("unreached_on_12 must be a tuple of distinct function names")
    problems += _effect_problems(getattr(cls, "effect", None), _probe_releases(patch))
    # target_file depends on the release: check it at the releases `tested` names now, and at
    # the target's own release when a command runs (Patch.package_file).
    for release in [] if problems else _probe_releases(patch):
        try:
            with blame(patch):
                path = cls.target_file(patch, release)
        except Exception:
            continue  # reported with its plugin's name when a command calls it
        problem = None if path is None else path_problem(path)
        if problem is not None:
            problems.append(f"target_file names {path!r} for SGLang {release}, which {problem}")
            break
    if problems:
        raise CatalogueError(f"patch {cls.__module__}.{cls.__name__}: {'; '.join(problems)}")


def _names(value: object, shape: re.Pattern[str]) -> bool:
    """A tuple of distinct strings, each in `shape`."""
    return (
        isinstance(value, tuple)
        and all(isinstance(v, str) and shape.fullmatch(v) for v in value)
        and len(set(value)) == len(value)
    )


_CLASS_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_MODULE = re.compile(r"sglang(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
_QUANTIZATION = re.compile(r"[a-z0-9][a-z0-9_\-]*")
_FLAG = re.compile(r"--[a-z0-9][a-z0-9\-]*(?: [A-Za-z0-9_.\-]+)?")


def _concerns_problems(concerns: object) -> list[str]:
    """What is wrong with a patch's `concerns` (doctor matches models and flags by it)."""
    if not isinstance(concerns, Concerns):
        return ["concerns must be a Concerns(...)"]
    problems = []
    if not _names(concerns.architectures, _CLASS_NAME):
        problems.append("concerns.architectures must be a tuple of distinct class names")
    if not _names(concerns.uses, _MODULE):
        problems.append("concerns.uses must be a tuple of distinct sglang.* module names")
    if not _names(concerns.quantization, _QUANTIZATION):
        problems.append(
            "concerns.quantization must be a tuple of distinct --quantization names (fp8, mxfp4)"
        )
    flag = concerns.flag
    if flag is not None and not (isinstance(flag, str) and _FLAG.fullmatch(flag)):
        problems.append("concerns.flag must be None or one option, `--name` or `--name value`")
    unless = concerns.unless
    if unless is not None and not (isinstance(unless, str) and _FLAG.fullmatch(unless)):
        problems.append("concerns.unless must be None or one option, `--name` or `--name value`")
    above = concerns.vision_head_above
    if not (type(above) is int and above >= 0):
        problems.append("concerns.vision_head_above must be a head size (0: no such need)")
    sizes = concerns.head_sizes
    if not (isinstance(sizes, tuple) and all(type(n) is int and n > 0 for n in sizes)):
        problems.append("concerns.head_sizes must be a tuple of head sizes")
    pairs = concerns.backends
    if not (
        isinstance(pairs, tuple)
        and all(
            isinstance(p, tuple) and len(p) == 2 and all(isinstance(x, str) and x for x in p)
            for p in pairs
        )
    ):
        problems.append("concerns.backends must be a tuple of (kind, backend) pairs of names")
    if concerns.runtime not in RUNTIMES:
        problems.append(f"concerns.runtime must be one of {', '.join(RUNTIMES)}")
    elif concerns.runtime != "srt" and (concerns.architectures or concerns.uses):
        problems.append("concerns of a multimodal_gen patch name no srt models")
    return problems


def _effect_problems(effect: object, releases: list[Version]) -> list[str]:
    """An `Effect`, or a `ByRelease` table of them with one row for each release `tested` names."""
    if isinstance(effect, Effect):
        return []
    if not isinstance(effect, ByRelease) or not all(
        isinstance(v, Effect) for v in effect.rows.values()
    ):
        return ["effect must be an Effect or a ByRelease table of Effects"]
    for release in releases:
        try:
            row = effect.get(release)
        except ValueError as error:
            return [f"effect: {error}"]
        if row is None:
            return [f"effect has no row for SGLang {release}"]
    return []


def _module_doc(cls: type) -> bool:
    module = sys.modules.get(cls.__module__)
    return module is not None and bool((module.__doc__ or "").strip())
