"""`apply`, all or nothing and recorded first; `preview`, what `apply --interactive` asks about."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import diff, engine
from sglpatch.api.common import commit_message, owned_elsewhere, patches_for, record_of, release_of
from sglpatch.patch import Patch
from sglpatch.reports import ApplyReport, Preview
from sglpatch.results import Applied, Outcome
from sglpatch.store import FileRecord, Record, State, journal, sha256
from sglpatch.target import Target, find_target, parse_release


def apply(
    target_path: Path | None,
    version: str | None,
    ledger_dir: Path | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    catalog: Path | None = None,
    only: Collection[str] | None = None,
    skip: Collection[str] = (),
    record_skipped: bool = True,
) -> ApplyReport:
    """Apply every patch for the target's release (or those in `only`, less those in `skip`),
    all or nothing, recording it first.

    With `record_skipped`, the patches left out are recorded as the user's choice (status shows
    them as skipped, `status --check` does not count them); `apply --interactive` passes False,
    since a patch it never asked about was not declined.
    """
    target = find_target(target_path, parse_release(version) if version else None)
    release = release_of(target)
    patches, untested, left_out = patches_for(release, catalog, force, only, skip)
    left_out = left_out if record_skipped else ()
    record = record_of(target, ledger_dir)
    if dry_run:
        return _plan_apply(record, target, release, patches, untested, write=False, finished=None)
    record.repository.require_git()
    with record.locked():
        finished = journal.finish_interrupted(record, target)
        return _plan_apply(
            record,
            target,
            release,
            patches,
            untested,
            write=True,
            finished=finished,
            left_out=left_out,
        )


def _plan_apply(
    record: Record,
    target: Target,
    release: Version,
    patches: list[Patch],
    untested: tuple[str, ...],
    *,
    write: bool,
    finished: journal.Change | None,
    left_out: tuple[str, ...] = (),
) -> ApplyReport:
    state = record.state()
    ours = state.patches if state.release == str(release) else []
    plan = engine.plan(target, patches, release, ours)
    text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
    changed = tuple(c.path for c in plan.changes)
    commit = None
    after = _applied_state(state, release, plan.outcomes, plan.changes, left_out)
    # A new choice to skip is recorded even when no file changes, unless the record holds
    # another release's files (an upgrade), which only a real apply may start afresh.
    newly_skipped = after.skipped != state.skipped and state.release in (None, str(release))
    if write and (plan.changes or newly_skipped) and not plan.failures:
        patch_ids = [p for c in plan.changes for p in c.patch_ids]
        change = journal.Change(
            "apply",
            commit_message("apply", target, release, patch_ids, after.skipped),
            after,
            {
                # A patch added on top of our own keeps the first original: never overwrite it.
                **{
                    f"original/{c.path}": c.before
                    for c in plan.changes
                    if after.files[c.path].original == sha256(c.before)
                },
                **{f"patched/{c.path}": c.after for c in plan.changes},
            },
            tuple(journal.Write(c.path, sha256(c.before), c.after, c.before) for c in plan.changes),
            previous=state,
        )
        commit = journal.carry_out(record, target, change)
    return ApplyReport(
        target,
        record.directory,
        owned_elsewhere(record, plan.outcomes, release),
        text,
        changed,
        commit is not None,
        commit,
        untested,
        finished.action if finished else None,
    )


def _applied_state(
    state: State,
    release: Version,
    outcomes: tuple[Outcome, ...],
    changes: tuple[engine.FileChange, ...],
    left_out: tuple[str, ...] = (),
) -> State:
    """The state after this apply; a record from another release (an upgrade) starts afresh.

    Skipped: what earlier applies on this release left out, plus what this one left out,
    less what is ours now.
    """
    same = state.release == str(release)
    files = dict(state.files) if same else {}
    for change in changes:
        earlier = files.get(change.path)
        # Adding a patch on top of our own earlier one keeps the first original.
        if earlier is not None and earlier.patched == sha256(change.before):
            original, kept = earlier.original, earlier.patches
        else:
            original, kept = sha256(change.before), []
        files[change.path] = FileRecord(
            original, sha256(change.after), sorted({*kept, *change.patch_ids})
        )
    ours = set(state.patches) if same else set()
    ours |= {o.patch_id for o in outcomes if isinstance(o, Applied)}
    skipped = (set(state.skipped) if same else set()) | set(left_out)
    return State(str(release), sorted(ours), files, sorted(skipped - ours), state.extra)


def preview(
    target_path: Path | None,
    version: str | None,
    ledger_dir: Path | None = None,
    *,
    force: bool = False,
    catalog: Path | None = None,
) -> list[Preview]:
    """Each patch on its own, with its diff: what `apply --interactive` asks about."""
    target = find_target(target_path, parse_release(version) if version else None)
    release = release_of(target)
    patches, _, _ = patches_for(release, catalog, force)
    state = record_of(target, ledger_dir).state()
    ours = state.patches if state.release == str(release) else []
    previews = []
    for patch in patches:
        plan = engine.plan(target, [patch], release, ours)
        text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
        previews.append(Preview(patch.id, patch.description, plan.outcomes[0], text))
    return previews
