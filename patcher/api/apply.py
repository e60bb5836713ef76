"""`apply`, all or nothing and recorded first; `preview`, what `apply --interactive` asks about."""

from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import diff, engine
from sglpatch.api.common import owned_elsewhere, patches_for, record_of, release_of
from sglpatch.patch import Patch
from sglpatch.reports import ApplyReport, Preview
from sglpatch.results import Applied
from sglpatch.store import Record, finish_interrupted, record_apply
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
    record.require_git()
    with record.locked():
        finished = finish_interrupted(record)
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
    finished: str | None,
    left_out: tuple[str, ...] = (),
) -> ApplyReport:
    state = record.state()
    ours = state.patches if state.release == str(release) else []
    plan = engine.plan(target, patches, release, ours)
    text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
    changed = tuple(c.path for c in plan.changes)
    commit = None
    if write and not plan.failures:
        applied = [o.patch_id for o in plan.outcomes if isinstance(o, Applied)]
        commit = record_apply(record, state, release, plan.changes, applied, left_out)
    return ApplyReport(
        target,
        record.directory,
        owned_elsewhere(record, plan.outcomes, release),
        text,
        changed,
        commit is not None,
        commit,
        untested,
        finished,
    )


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
        outcome = plan.outcomes[0]
        previews.append(Preview(patch.id, patch.description, outcome, text, patch.applied_with))
    return previews
