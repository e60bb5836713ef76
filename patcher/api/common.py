"""What more than one command needs: the record, the release, the patches to run, messages."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import __version__, catalogue
from sglpatch.errors import RefusedError, UsageError
from sglpatch.patch import Patch
from sglpatch.reading import NotRegularFile, read_regular
from sglpatch.results import AlreadyApplied, Outcome
from sglpatch.store import Ledger, Record, default_directory
from sglpatch.target import Target


def record_of(target: Target, ledger_dir: Path | None) -> Record:
    return Ledger(ledger_dir or default_directory()).record(target)


def release_of(target: Target) -> Version:
    if target.release is None:  # find_target(required=True) settles it; never guess
        raise UsageError(f"cannot tell which SGLang release {target.root} is; pass --version")
    return target.release


def patches_for(
    release: Version,
    catalog: Path | None,
    force: bool,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
) -> tuple[list[Patch], tuple[str, ...], tuple[str, ...]]:
    """The catalogue to run, refusing a release outside a patch's tested range unless forced;
    and the ids that `only` and `skip` left out."""
    patches = catalogue.load(catalog)
    known = [p.id for p in patches]
    unknown = (set(only or ()) | set(skip)) - set(known)
    if unknown:
        raise UsageError(
            f"no patch called {', '.join(sorted(unknown))} in the catalogue; "
            f"known: {', '.join(sorted(known))}"
        )
    chosen = [p for p in patches if (only is None or p.id in only) and p.id not in skip]
    left_out = tuple(p.id for p in patches if p not in chosen)
    patches = chosen
    untested = tuple(p.id for p in patches if not p.is_tested(release))
    if untested and not force:
        ranges = "; ".join(f"{p.id}: {p.tested}" for p in patches if p.id in untested)
        raise RefusedError(
            f"SGLang {release} is outside the tested releases ({ranges}); "
            "--force runs the codemods anyway"
        )
    return patches, untested, left_out


def owned_elsewhere(
    record: Record, outcomes: tuple[Outcome, ...], release: Version
) -> tuple[Outcome, ...]:
    """ "Already upstream" is wrong for a file another ledger record says sglpatch patched,
    unless the release itself has the fix (other patches may share the file)."""

    def relabelled(o: Outcome) -> bool:
        return (
            isinstance(o, AlreadyApplied)
            and o.by == "upstream"
            and o.file in foreign
            and (o.fixed_in is None or release < o.fixed_in)
        )

    if not any(isinstance(o, AlreadyApplied) and o.by == "upstream" for o in outcomes):
        return outcomes
    foreign = record.ledger.foreign(record)
    return tuple(
        AlreadyApplied(o.patch_id, o.file, "sglpatch", elsewhere_note(*foreign[o.file]))
        if relabelled(o) and isinstance(o, AlreadyApplied)
        else o
        for o in outcomes
    )


def elsewhere_note(folder: Path, owner: str) -> str:
    return f"recorded in another ledger at {folder} (target {owner})"


def read_or_none(path: Path) -> bytes | None:
    """A regular file's bytes; None if it is missing or not a regular file."""
    try:
        return read_regular(path)
    except (FileNotFoundError, NotRegularFile):
        return None


def commit_message(
    action: str,
    target: Target,
    release: Version | None,
    patch_ids: list[str],
    skipped: list[str] | None = None,
) -> str:
    ids = ", ".join(sorted(set(patch_ids))) or "-"
    return (
        f"{action}: {ids} (SGLang {release})\n\n"
        f"target: {target.root}\n"
        f"release: {release}\n"
        f"patches: {ids}\n"
        + (f"skipped: {', '.join(skipped)}\n" if skipped else "")
        + f"sglpatch: {__version__}\n"
    )
