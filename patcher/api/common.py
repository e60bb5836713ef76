"""What more than one command needs: the record, the release, the patches to run, messages."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import catalogue
from sglpatch.errors import RefusedError, UsageError
from sglpatch.patch import Patch
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
    _refuse_halves(release, chosen, [p for p in patches if p not in chosen])
    left_out = tuple(p.id for p in patches if p not in chosen)
    patches = chosen
    untested = tuple(p.id for p in patches if not p.is_tested(release))
    if untested and not force:
        raise RefusedError(untested_refusal(release, [p for p in patches if p.id in untested]))
    return patches, untested, left_out


def _refuse_halves(release: Version, chosen: list[Patch], left: list[Patch]) -> None:
    """One half of a change made in two files, without its other half, could run wrong (the
    DSA indexer's torch logits with DeepGEMM's schedule left out): refuse, in one line."""
    left_ids = {p.id: p for p in left}
    for patch in chosen:
        for other in patch.applied_with:
            half = left_ids.get(other)
            if half is not None and half.target_file(release) is not None:
                raise UsageError(
                    f"{patch.id} and {other} are one change in two files: choose both or neither"
                )


def untested_refusal(release: Version, untested: list[Patch]) -> str:
    """One short line: the release, each tested range once (most share one), and --force."""
    ranges: dict[str, list[str]] = {}
    for patch in untested:
        ranges.setdefault(tested_range(patch), []).append(patch.id)
    if len(ranges) == 1:
        (tested,) = ranges
        said = f"the patches are tested on {tested}"
    else:
        said = "tested: " + "; ".join(
            f"{tested} ({ids[0]}{f' and {len(ids) - 1} more' if len(ids) > 1 else ''})"
            for tested, ids in ranges.items()
        )
    return f"SGLang {release} is untested ({said}); --force runs the codemods anyway"


def tested_range(patch: Patch) -> str:
    """`>=0.5.3,<=0.5.23` with the lower bound first (a SpecifierSet sorts its text)."""
    return ",".join(sorted(str(patch.tested).split(","), key=lambda s: not s.startswith(">")))


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
