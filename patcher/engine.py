"""Running the codemods in memory: parse each file once, transform, prove, never write."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from typing import TYPE_CHECKING, Literal, NamedTuple

from packaging.version import Version

from sglpatch import collector, elision
from sglpatch.lazy import lazy_import
from sglpatch.patch import Patch, blame
from sglpatch.patch_errors import (
    EXPECTED,
    AlreadyPresent,
    AlreadyUpstream,
    AnchorMissing,
    PostconditionFailed,
)
from sglpatch.reading import NotRegularFile, read_regular
from sglpatch.results import AlreadyApplied, Applied, Failed, NotApplicable, Outcome
from sglpatch.target import Target, symlink_on_the_way

if TYPE_CHECKING:
    import libcst as cst
else:
    cst = lazy_import("libcst")


class FileChange(NamedTuple):
    """New bytes for one file; `path` is relative to the target root."""

    path: str
    before: bytes
    after: bytes
    patch_ids: tuple[str, ...]


class Plan(NamedTuple):
    outcomes: tuple[Outcome, ...]
    changes: tuple[FileChange, ...]

    @property
    def failures(self) -> list[Failed]:
        return [o for o in self.outcomes if isinstance(o, Failed)]


def plan(
    target: Target,
    patches: Sequence[Patch],
    release: Version,
    ours: Collection[str] = (),
    sources: Mapping[str, bytes] | None = None,
) -> Plan:
    """Work out every patch's outcome and the resulting bytes; `ours` are ids the ledger holds.

    `sources` stands in for files on disk (by path from the target root), e.g. recorded originals.
    """
    outcomes: dict[str, Outcome] = {}
    by_file: dict[str, list[Patch]] = {}
    for patch in patches:
        package_path = patch.package_file(release)
        if package_path is None:
            outcomes[patch.id] = NotApplicable(
                patch.id, f"SGLang {release} does not have the code this patch fixes"
            )
        else:
            by_file.setdefault(package_path, []).append(patch)
    changes = []
    with collector.paused():
        for package_path, file_patches in by_file.items():
            change, file_outcomes = _patch_file(
                target, package_path, file_patches, release, ours, sources or {}
            )
            outcomes.update(file_outcomes)
            if change is not None:
                changes.append(change)
    return Plan(tuple(outcomes[p.id] for p in patches), tuple(changes))


def _patch_file(
    target: Target,
    package_path: str,
    patches: list[Patch],
    release: Version,
    ours: Collection[str],
    sources: Mapping[str, bytes],
) -> tuple[FileChange | None, dict[str, Outcome]]:
    shown = target.relative(package_path)
    if shown in sources:
        return transform_source(sources[shown], shown, patches, release, ours)
    try:
        source = _read_source(target, package_path)
    except _Unreadable as error:
        return None, {p.id: Failed(p.id, shown, str(error)) for p in patches}
    return transform_source(source, shown, patches, release, ours)


def transform_source(
    source: bytes,
    shown: str,
    patches: Sequence[Patch],
    release: Version,
    ours: Collection[str] = (),
) -> tuple[FileChange | None, dict[str, Outcome]]:
    """Run `patches` in turn over one file's bytes; `shown` names the file in results."""
    parsed = parse_for(source, patches, release)
    if isinstance(parsed, Parsed) and parsed.cut is not None:
        done = _in_part(parsed, shown, patches, release, ours)
        if done is not None:
            after, applied, outcomes = done
            change = FileChange(shown, source, after, applied) if after is not None else None
            return change, outcomes
        parsed = whole(parsed)
    if isinstance(parsed, str):
        return None, {p.id: Failed(p.id, shown, parsed) for p in patches}
    return transform_module(parsed.module, source, shown, patches, release, ours)


def parse(source: bytes) -> cst.Module | str:
    """One file's bytes parsed, or why they cannot be (a syntax error)."""
    # Load libcst before the try: a Ctrl-C while it imports must surface as KeyboardInterrupt,
    # not as the AttributeError that evaluating the except clause on a half-loaded module gives.
    parse_module, syntax_error = cst.parse_module, cst.ParserSyntaxError
    try:
        return parse_module(source)
    except syntax_error as error:
        return f"syntax error at line {error.raw_line}: {error.message}"


class Parsed(NamedTuple):
    """A file parsed for the patches that run over it; `cut`: the statements left out of
    `module` (`elision`), None when it is the whole file."""

    source: bytes
    module: cst.Module
    cut: elision.Elided | None = None

    def bytes_of(self, patched: cst.Module) -> bytes | None:
        """The file's bytes once patched (`patched` is `module` transformed); None: the
        statements left out cannot be put back (parse it `whole` and run again)."""
        return patched.bytes if self.cut is None else elision.splice(self.cut, patched.bytes)


def parse_for(source: bytes, patches: Sequence[Patch], release: Version) -> Parsed | str:
    """`parse`, of only the definitions `patches` read on `release` when each says which
    (`Patch.reads`); a str: why the file cannot be parsed."""
    names: set[str] = set()
    for patch in patches:
        reads = patch.reads_on(release)
        if reads is None:
            names.clear()
            break
        names |= reads
    cut = elision.elide(source, names) if names else None
    if cut is not None:
        module = parse(cut.text)
        if not isinstance(module, str):
            return Parsed(source, module, cut)
    module = parse(source)
    return module if isinstance(module, str) else Parsed(source, module)


def whole(parsed: Parsed) -> Parsed | str:
    """The file of `parsed` parsed whole."""
    if parsed.cut is None:
        return parsed
    module = parse(parsed.source)
    return module if isinstance(module, str) else Parsed(parsed.source, module)


def run_alone(
    parsed: Parsed, shown: str, patch: Patch, release: Version, render: bool = True
) -> tuple[Outcome, bytes | None, Parsed | str]:
    """One patch on its own over `parsed` (left as it is): its outcome, with `render` the file's
    bytes once it applied, and the parse for the next patch. A file parsed in part is parsed
    whole, and the patch run again, where the part cannot answer for it (`_in_part`)."""
    if parsed.cut is not None:
        done = _in_part(parsed, shown, [patch], release, render=render)
        if done is not None:
            return done[2][patch.id], done[0], parsed
        again = whole(parsed)
        if isinstance(again, str):
            return Failed(patch.id, shown, again), None, again
        parsed = again
    patched, _, outcomes = transform_tree(parsed.module, shown, [patch], release)
    after = patched.bytes if patched is not None and render else None
    return outcomes[patch.id], after, parsed


def _in_part(
    parsed: Parsed,
    shown: str,
    patches: Sequence[Patch],
    release: Version,
    ours: Collection[str] = (),
    *,
    render: bool = True,
) -> tuple[bytes | None, tuple[str, ...], dict[str, Outcome]] | None:
    """`patches` over a file parsed in part: with `render`, the file's bytes once patched (None:
    nothing applied), the ids applied, the outcomes. None where the part cannot stand for the
    whole file: a patch failed or raised there, or what was left out cannot be put back."""
    try:
        patched, applied, outcomes = transform_tree(parsed.module, shown, patches, release, ours)
    except Exception:  # whatever the part raises, the whole file decides
        return None
    if any(isinstance(o, Failed) for o in outcomes.values()):
        return None
    after = parsed.bytes_of(patched) if patched is not None and render else None
    if patched is not None and render and after is None:
        return None
    return after, applied, outcomes


def transform_module(
    module: cst.Module,
    source: bytes,
    shown: str,
    patches: Sequence[Patch],
    release: Version,
    ours: Collection[str] = (),
) -> tuple[FileChange | None, dict[str, Outcome]]:
    """`transform_source` on a file parsed already (`parse(source)`), which it leaves as it is:
    one parse serves every patch that is to be run on its own over the same file."""
    patched, applied, outcomes = transform_tree(module, shown, patches, release, ours)
    if patched is None:
        return None, outcomes
    return FileChange(shown, source, patched.bytes, applied), outcomes


def transform_tree(
    module: cst.Module,
    shown: str,
    patches: Sequence[Patch],
    release: Version,
    ours: Collection[str] = (),
) -> tuple[cst.Module | None, tuple[str, ...], dict[str, Outcome]]:
    """`transform_module` without writing out the new code: the patched tree (None when no
    patch applied) and the ids applied, for a caller that renders the tree only when it reads
    the result (writing out a large module costs as much as its transforms)."""
    outcomes: dict[str, Outcome] = {}
    applied: list[str] = []
    for patch in patches:
        try:
            with blame(patch, EXPECTED):
                patched = patch.transform(module, release)
                if not isinstance(patched, cst.Module):  # its .code would be the plugin's too
                    raise TypeError(
                        f"transform returned {type(patched).__name__}, not a libcst Module"
                    )
                patch.postcondition(patched, release)
                _require_idempotent(patch, patched, release)
        except AlreadyPresent as present:
            try:
                with blame(patch, EXPECTED):
                    patch.postcondition(module, release)
            except PostconditionFailed as error:
                outcomes[patch.id] = Failed(patch.id, shown, f"change present but {error}")
                continue
            by: Literal["sglpatch", "upstream"] = "sglpatch" if patch.id in ours else "upstream"
            fixed_in = None if by == "sglpatch" else patch.fixed_upstream_in
            outcomes[patch.id] = AlreadyApplied(patch.id, shown, by, str(present), fixed_in)
        except AlreadyUpstream as upstream:
            outcomes[patch.id] = AlreadyApplied(
                patch.id, shown, "upstream", str(upstream), patch.fixed_upstream_in
            )
        except (AnchorMissing, PostconditionFailed) as error:
            outcomes[patch.id] = Failed(patch.id, shown, str(error))
        else:
            module = patched
            applied.append(patch.id)
            outcomes[patch.id] = Applied(patch.id, shown)
    return (module if applied else None), tuple(applied), outcomes


def _require_idempotent(patch: Patch, patched: cst.Module, release: Version) -> None:
    try:
        again = patch.transform(patched, release)
    except (AlreadyPresent, AlreadyUpstream):
        return
    except AnchorMissing as error:
        raise PostconditionFailed(f"its own output lost the anchor ({error})") from None
    if again.code != patched.code:
        raise PostconditionFailed("a second run would change the file again")


class _Unreadable(Exception):
    pass


def _read_source(target: Target, package_path: str) -> bytes:
    path = target.path(package_path)
    if path.is_symlink():
        raise _Unreadable("is a symbolic link; sglpatch only rewrites regular files")
    linked = symlink_on_the_way(target, package_path)
    if linked is not None:
        raise _Unreadable(
            f"{linked} is a symbolic link to a directory; sglpatch only rewrites regular files "
            "inside the tree"
        )
    try:
        source = read_regular(path)  # a FIFO or a device here is refused, never waited on
    except FileNotFoundError:
        raise _Unreadable("file is missing") from None
    except NotRegularFile as error:
        raise _Unreadable(error.strerror) from None
    except OSError as error:
        raise _Unreadable(f"cannot read: {error.strerror}") from None
    try:
        source.decode("utf-8")
    except UnicodeDecodeError as error:
        raise _Unreadable(f"not UTF-8 text (byte {error.start})") from None
    return source
