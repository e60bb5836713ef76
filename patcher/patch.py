"""What a patch module declares. Subclass `Patch` once per module in `sglpatch.patches`."""

from __future__ import annotations

import functools
import sys
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from types import FunctionType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.errors import CatalogueError, PatchCrashed, raised, text_of

if TYPE_CHECKING:
    import libcst as cst

T = TypeVar("T")


class AnchorMissing(Exception):
    """The code a patch edits is not where it should be; the patch never guesses (cf. SkipFile)."""


class AlreadyPresent(Exception):
    """The patch's change is already in the file: ours from an earlier apply, or upstream's."""


class AlreadyUpstream(Exception):
    """Upstream solved the problem its own way; the file must not be touched."""


class PostconditionFailed(Exception):
    """The transformed file does not have the property the patch promises."""


class ByRelease(Generic[T]):
    """A small table of per-release facts (file names, symbol names), keyed by PEP 440 specifiers.

    Exactly one row may match a release; overlapping rows are a bug in the patch module.
    """

    def __init__(self, rows: Mapping[str, T]) -> None:
        self.rows = {SpecifierSet(spec): value for spec, value in rows.items()}

    def get(self, release: Version) -> T | None:
        matches = [v for spec, v in self.rows.items() if spec.contains(release, prereleases=True)]
        if len(matches) > 1:
            raise ValueError(f"{len(matches)} rows match release {release}")
        return matches[0] if matches else None


class Patch(ABC):
    """One fix to SGLang source, applied as a LibCST codemod.

    Subclasses declare, as class attributes:
      id                 stable identifier used in the ledger and on the command line
      description        one line: what it changes and why
      symptom            one line: what a capability-12 (or model) user sees without it
      tested             the releases it has been tested on (a PEP 440 specifier)
      fixed_upstream_in  the first release whose own code no longer needs it, if any
    and implement `target_file`, `transform` and `postcondition`.
    """

    id: ClassVar[str]
    description: ClassVar[str]
    symptom: ClassVar[str]
    tested: ClassVar[SpecifierSet]
    fixed_upstream_in: ClassVar[Version | None] = None
    # Where the catalogue found the patch ("built-in", a plugin's name or a folder); set on load.
    origin: str = "built-in"

    def package_file(self, release: Version) -> str | None:
        """`target_file`, checked: a relative path that stays inside the `sglang` package."""
        with blame(self):
            path = self.target_file(release)
        if path is None:
            return None
        problem = path_problem(path)
        if problem is not None:
            raise CatalogueError(
                f"patch {self.id} ({self.origin}) names {path!r} for SGLang {release}, which "
                f"{problem}; refused, nothing was written"
            )
        return path

    def is_tested(self, release: Version) -> bool:
        with blame(self):  # `tested` is the plugin's object
            return self.tested.contains(release, prereleases=True)

    def fixed_upstream(self, release: Version) -> bool:
        with blame(self):
            return self.fixed_upstream_in is not None and release >= self.fixed_upstream_in

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # sglpatch calls these from many places (the engine, api, doctor): a subclass's own
        # version runs blamed wherever it is called from.
        for name, expected in _HOOKS.items():
            own = vars(cls).get(name)
            if isinstance(own, FunctionType):  # not a staticmethod or property
                setattr(cls, name, _blamed(own, expected))

    @abstractmethod
    def target_file(self, release: Version) -> str | None:
        """The file to edit, relative to the `sglang` package; None if the release has none."""

    @abstractmethod
    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        """Return the patched module, or raise AnchorMissing, AlreadyPresent or AlreadyUpstream."""

    @abstractmethod
    def postcondition(self, module: cst.Module, release: Version) -> None:
        """Raise PostconditionFailed unless `module` has the property this patch promises."""


def path_problem(path: object) -> str | None:
    """Why `path` cannot name a file inside the `sglang` package; None if it can.

    Relative, `/`-separated, no `.`, `..` or empty parts: then it cannot climb out. Symbolic links
    on the way are checked against the tree itself when the file is read (see the engine).
    """
    if not isinstance(path, str) or not path:
        return "is not a path"
    if path.startswith("/") or (len(path) > 1 and path[1] == ":"):
        return "is absolute"
    if "\\" in path or "\0" in path:
        return "holds a backslash or NUL"
    if any(part in ("", ".", "..") for part in path.split("/")):
        return "has an empty, '.' or '..' part"
    return None


EXPECTED: tuple[type[BaseException], ...] = (
    AnchorMissing,
    AlreadyPresent,
    AlreadyUpstream,
    PostconditionFailed,
)
# A patch's methods, and what each may raise as an answer rather than a fault.
_HOOKS: dict[str, tuple[type[BaseException], ...]] = {
    "target_file": (),
    "package_file": (),  # an override: its CatalogueError is no more ours than any error
    "transform": EXPECTED,
    "postcondition": EXPECTED,
    "is_tested": (),
    "fixed_upstream": (),
}
# The patch whose code runs now: a blamed call inside another leaves the answer to the outer one.
_running: list[Patch] = []


@contextmanager
def blame(patch: Patch, expected: tuple[type[BaseException], ...] = ()) -> Iterator[None]:
    """Run a patch's own code; whatever a plugin's code raises names the plugin and the patch.

    `SystemExit` (a `sys.exit()` in the plugin) is a failure too: a plugin's code never chooses
    sglpatch's exit code. Only Ctrl-C (KeyboardInterrupt) and `expected` pass unchanged. What the
    code prints goes to stderr: stdout may have to be one JSON object. A built-in patch that
    raises is sglpatch's bug, and goes on to the internal-error handler.
    """
    if _running:
        yield
        return
    _running.append(patch)
    try:
        with redirect_stdout(sys.stderr):
            yield
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        if isinstance(error, expected) or patch.origin == "built-in":
            raise
        raise _crashed(patch, error) from error
    finally:
        _running.pop()


def _crashed(patch: Patch, error: BaseException) -> PatchCrashed:
    """The one-line error for a plugin patch whose code raised `error` (being handled now)."""
    import traceback

    found = PatchCrashed(
        f"patch {text_of(getattr(patch, 'id', type(patch).__name__))} from {patch.origin} raised "
        f"{raised(error)}; nothing was written"
    )
    found.details = traceback.format_exc()
    return found


def _blamed(
    method: Callable[..., Any], expected: tuple[type[BaseException], ...]
) -> Callable[..., Any]:
    @functools.wraps(method)
    def run(self: Patch, *args: Any, **kwargs: Any) -> Any:
        with blame(self, expected):
            return method(self, *args, **kwargs)

    return run
