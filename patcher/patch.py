"""What a patch module declares, and the one place it imports from.

Subclass `Patch` once per module in `sglpatch.patches` (or in a plugin). Everything a patch
module needs comes from here:

    from sglpatch.patch import TESTED, AlreadyPresent, ByRelease, Patch, cst, cst_tools

and, when it concerns only some start-ups, `Concerns` and `Effect` (doctor reads them).

`cst` is libcst and `cst_tools` sglpatch's exact edits on its trees; both load on first use, so
`status` and `list` never pay for libcst. `TESTED` is the range of releases the built-in catalogue
is tested on: a new SGLang release is one edit, `NEWEST_TESTED`.
"""

from __future__ import annotations

import functools
import sys
from abc import ABC, ABCMeta, abstractmethod
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager, redirect_stdout
from enum import Enum
from types import FunctionType
from typing import TYPE_CHECKING, Any, ClassVar, Generic, NamedTuple, TypeVar

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.errors import CatalogueError, PatchCrashed, interrupted, raised, text_of
from sglpatch.lazy import lazy_import
from sglpatch.patch_errors import (
    EXPECTED,
    AlreadyPresent,
    AlreadyUpstream,
    AnchorMissing,
    PostconditionFailed,
)
from sglpatch.plugin_stdout import to_stderr

if TYPE_CHECKING:
    import libcst as cst

    from sglpatch import cst_tools
else:
    cst = lazy_import("libcst")
    cst_tools = lazy_import("sglpatch.cst_tools")

# What a patch module, built-in or plugin, imports from here.
__all__ = [
    "NEWEST_TESTED",
    "OLDEST_TESTED",
    "TESTED",
    "AlreadyPresent",
    "AlreadyUpstream",
    "AnchorMissing",
    "ByRelease",
    "Concerns",
    "Effect",
    "Patch",
    "PostconditionFailed",
    "cst",
    "cst_tools",
    "since",
]

# The releases tests/test_matrix.py proves the whole built-in catalogue on. A new SGLang release
# is this one edit here (and its name in tests/support/releases.py's list of releases).
OLDEST_TESTED = "0.5.3"
NEWEST_TESTED = "0.5.23"


def since(oldest: str) -> SpecifierSet:
    """`>=oldest,<=NEWEST_TESTED`: for `tested = since("0.5.9")`, a built-in patch tested from
    `oldest` on (a plugin states its own range: sglpatch's newest is not tested for it)."""
    return SpecifierSet(f">={oldest},<={NEWEST_TESTED}")


# What a built-in patch declares as `tested`, unless it has a range of its own.
TESTED = since(OLDEST_TESTED)

T_co = TypeVar("T_co", covariant=True)  # a ByRelease[str] is a ByRelease[str | None]


class ByRelease(Generic[T_co]):
    """A small table of per-release facts (file names, symbol names), keyed by PEP 440 specifiers.

    Exactly one row may match a release; overlapping rows are a bug in the patch module.
    """

    def __init__(self, rows: Mapping[str, T_co]) -> None:
        self.rows = {SpecifierSet(spec): value for spec, value in rows.items()}

    def get(self, release: Version) -> T_co | None:
        matches = [v for spec, v in self.rows.items() if spec.contains(release, prereleases=True)]
        if len(matches) > 1:
            raise ValueError(f"{len(matches)} rows match release {release}")
        return matches[0] if matches else None


class Effect(Enum):
    """What a pending patch changes on a capability-12 part, on one release (doctor's blockers)."""

    # Without it a capability-12 start-up or request fails, or takes a path that cannot run.
    RUN = "changes the run"
    # The run is the same with or without it on every capability-12 part (a table's missing row
    # filled in, code those parts never reach): reported as such, never a blocker.
    TABLE = "completes a table"


# Where the code a patch changes runs: the LLM server, or the diffusion runtime.
RUNTIMES = ("srt", "multimodal_gen")


class Concerns(NamedTuple):
    """Which start-ups reach the code a patch changes. The default: every model, default flags.

    architectures  the model classes it matters for, as config.json's `architectures` names
                   them (`KimiK25ForConditionalGeneration`); () with no `uses`: every model
    uses           or the models whose models module is, or imports from, one of these
                   modules (`sglang.srt.layers.attention.vision`: every model with that ViT)
    quantization   the checkpoint quantizations it matters for, as `--quantization` names
                   them (`fp8`, `modelopt_fp4`, `mxfp4`); (): every one, unquantized too
    flag           the opt-in start-up option without which the code is not reached
                   (`--enable-torch-symm-mem`); None: reached with default flags
    runtime        "srt" (the LLM server) or "multimodal_gen" (the diffusion runtime)
    config         config.json attributes a model must set for the code to be reached
                   (`index_topk`: the DSA form of DeepSeek-V3 and GLM); (): any config
    condition      what else about the model the failure needs, in words doctor shows, when
                   doctor cannot read it ("a vision head size above 128"); "": none
    vision_head_above
                   the failure needs a vision tower whose head size is above this (the model
                   config's `vision_config`): doctor judges it where it reads the config, and
                   shows `condition` where it does not; 0: no such need
    unless         the launch option (`--name` or `--name value`) with which the code is not
                   reached although the model is (`--kv-cache-dtype fp8_e4m3`: TileLang's FP8
                   kernel, not the bf16 one), given or resolved so by the start-up (its field
                   is the option's name with `_` for `-`); None: none
    head_sizes     the failure needs one of these attention head sizes (the query head size:
                   MLA's `kv_lora_rank + qk_rope_head_dim`, else `head_dim`): doctor judges it
                   where it reads the config, and shows `condition` where it does not; (): any
    backends       the code is reached only when the model's start-up gives one of these
                   (table kind, backend) pairs, as it is or once the catalogue's start-up
                   patches are in (`("dsa", "tilelang")`); (): whatever it gives
    """

    architectures: tuple[str, ...] = ()
    uses: tuple[str, ...] = ()
    quantization: tuple[str, ...] = ()
    flag: str | None = None
    runtime: str = "srt"
    config: tuple[str, ...] = ()
    condition: str = ""
    vision_head_above: int = 0
    unless: str | None = None
    backends: tuple[tuple[str, str], ...] = ()
    head_sizes: tuple[int, ...] = ()

    @property
    def every_model(self) -> bool:
        return not self.architectures and not self.uses and self.runtime == "srt"


# For `Concerns.uses`: the package every MoE model takes its expert layers from (FusedMoE and its
# runners), directly or through the models module it builds on.
MOE_LAYERS = ("sglang.srt.layers.moe",)


def _reads_files(cls: type) -> bool:
    """Whether `cls` keeps `Patch`'s own `target_file`, the one that reads `files`."""
    owner = next(k for k in cls.__mro__ if "target_file" in vars(k))
    return owner.__module__ == __name__ and owner.__qualname__ == "Patch"


class _Declared(ABCMeta):
    """`Patch`'s metaclass: a subclass that names no file is abstract, as one without `transform`.

    It names one with a `files` table or a `target_file` of its own; with neither, the catalogue
    does not take it for a patch, as when every patch had to write `target_file`.
    """

    def __init__(
        cls, name: str, bases: tuple[type, ...], namespace: dict[str, Any], /, **kwargs: Any
    ) -> None:
        super().__init__(name, bases, namespace, **kwargs)
        if getattr(cls, "files", None) is None and _reads_files(cls):
            cls.__abstractmethods__ = cls.__abstractmethods__ | {"target_file"}


class Patch(ABC, metaclass=_Declared):
    """One fix to SGLang source, applied as a LibCST codemod.

    Subclasses declare, as class attributes:
      id                 stable identifier used in the ledger and on the command line
      description        one line: what it changes and why
      symptom            one line: what a capability-12 (or model) user sees without it
      tested             the releases it has been tested on (a PEP 440 specifier; the built-in
                         patches take `TESTED`, the catalogue's range)
      fixed_upstream_in  the first release whose own code no longer needs it, if any
      files              the file to edit on each release, relative to the `sglang` package
                         (a `ByRelease` table; None where a release has none)
      concerns           the models, quantizations and opt-in flag it matters for (`Concerns`;
                         by default every model with default flags)
      effect             `Effect.RUN` (the default) or `Effect.TABLE`, or a `ByRelease` table
                         of them where it differs by release
      unreached_on_12    functions of its file that capability 12 no longer calls once it is
                         in, where it fixes a decision by changing its input in another
                         function (doctor then counts the decisions inside them as covered);
                         its tests must prove it by running the release's code
      reads              the definitions of its file it reads and edits: top-level `def` and
                         `class` names, or `Class.method` (a `ByRelease` table where they
                         differ); the engine then parses only those, with the rest of the
                         file's statements around them (`elision`). None: the whole file. The
                         matrix test runs each such patch both ways on every release and
                         compares the outcomes and the bytes
      applied_with       ids of the patches that are the other halves of one change (each in
                         its own file): `--only`, `--skip` and `--interactive` must choose them
                         together where they have a file
    and implement `transform` and `postcondition`. `target_file` reads `files`; a patch whose
    file is not a table of releases overrides `target_file` instead.
    """

    id: ClassVar[str]
    description: ClassVar[str]
    symptom: ClassVar[str]
    tested: ClassVar[SpecifierSet]
    fixed_upstream_in: ClassVar[Version | None] = None
    files: ClassVar[ByRelease[str | None]]
    concerns: ClassVar[Concerns] = Concerns()
    effect: ClassVar[Effect | ByRelease[Effect]] = Effect.RUN
    unreached_on_12: ClassVar[tuple[str, ...]] = ()
    reads: ClassVar[tuple[str, ...] | ByRelease[tuple[str, ...]] | None] = None
    applied_with: ClassVar[tuple[str, ...]] = ()
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

    def effect_on(self, release: Version) -> Effect:
        """What the patch changes on `release`; a table of effects without a row for it: RUN
        (a blocker is the safe answer)."""
        with blame(self):
            declared = self.effect
            effect = declared.get(release) if isinstance(declared, ByRelease) else declared
            return effect if isinstance(effect, Effect) else Effect.RUN

    def reads_on(self, release: Version) -> frozenset[str] | None:
        """`reads` for `release`; None (the whole file) without a row, or for a value that is
        not a tuple of names."""
        with blame(self):
            declared = self.reads
            names = declared.get(release) if isinstance(declared, ByRelease) else declared
        if not isinstance(names, tuple) or not names or not all(isinstance(n, str) for n in names):
            return None
        return frozenset(names)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # sglpatch calls these from many places (the engine, api, doctor): a subclass's own
        # version runs blamed wherever it is called from.
        for name, expected in _HOOKS.items():
            own = vars(cls).get(name)
            if isinstance(own, FunctionType):  # not a staticmethod or property
                setattr(cls, name, _blamed(own, expected))

    def target_file(self, release: Version) -> str | None:
        """The file to edit, relative to the `sglang` package; None if the release has none.

        By default the row of `files` for `release`.
        """
        return self.files.get(release)

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


# A patch's methods, and what each may raise as an answer rather than a fault.
_HOOKS: dict[str, tuple[type[BaseException], ...]] = {
    "target_file": (),
    "package_file": (),  # an override: its CatalogueError is no more ours than any error
    "transform": EXPECTED,
    "postcondition": EXPECTED,
    "is_tested": (),
    "fixed_upstream": (),
    "effect_on": (),
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
        # A plugin's writes to descriptor 1 too (built-in patches write nothing: no syscalls)
        quiet = redirect_stdout(sys.stderr) if patch.origin == "built-in" else to_stderr()
        with quiet:
            yield
    except KeyboardInterrupt:
        raise
    except BaseException as error:
        if interrupted(error):  # a Ctrl-C that Python turned into another error
            raise KeyboardInterrupt from error
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
