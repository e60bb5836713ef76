"""`status` (from hashes and the ledger), `status --check` (from the files) and `log`."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from sglpatch import catalogue, engine
from sglpatch.api.common import elsewhere_note, record_of
from sglpatch.errors import UsageError
from sglpatch.patch import Patch
from sglpatch.reports import CheckReport, LogReport, PatchStatus, StatusReport
from sglpatch.results import AlreadyApplied, Applied, Failed, NotApplicable
from sglpatch.store import State, journal
from sglpatch.target import Target, find_target


def status(
    target_path: Path | None, ledger_dir: Path | None = None, catalog: Path | None = None
) -> StatusReport:
    """Per patch: applied, not applied, already upstream, not for this release or edited.

    Answered from file hashes and the ledger's records: no codemod runs, libcst is not loaded.
    """
    target = find_target(target_path, None, required=False)
    record = record_of(target, ledger_dir)
    state = record.state()
    interrupted = journal.pending(record)
    if interrupted is not None and interrupted != "unknown":
        change = journal.load(record)
        if change is not None:  # until it is finished, each file is on one side of it
            state = journal.effective_state(record, target, change)
    foreign: dict[str, tuple[Path, str]] | None = None

    def elsewhere(path: str) -> tuple[Path, str] | None:
        nonlocal foreign
        if foreign is None:
            foreign = record.ledger.foreign(record)
        return foreign.get(path)

    rows = tuple(_status_of(p, target, state, elsewhere) for p in catalogue.load(catalog))
    return StatusReport(target, record.directory, rows, interrupted)


def _status_of(
    patch: Patch,
    target: Target,
    state: State,
    elsewhere: Callable[[str], tuple[Path, str] | None],
) -> PatchStatus:
    release = target.release
    if release is None:
        return PatchStatus(patch.id, "unknown", None, "the target's release is unknown")
    package_path = patch.package_file(release)
    if package_path is None:
        return PatchStatus(patch.id, "not for this release", None)
    path = target.relative(package_path)
    file = state.files.get(path)
    if patch.id in state.patches and file is not None:
        digest = journal.current(target.root / path)
        if state.release != str(release):
            note = f"applied to {state.release}; the target is now {release} (upgraded)"
            return PatchStatus(patch.id, "not applied", path, note)
        if digest == file.patched:
            return PatchStatus(patch.id, "applied", path)
        if digest == file.original:
            return PatchStatus(
                patch.id, "not applied", path, "the original bytes are back (reinstalled?)"
            )
        if digest == "":
            return PatchStatus(patch.id, "edited since applied", path, "no longer a regular file")
        return PatchStatus(patch.id, "edited since applied", path)
    if patch.id in state.patches:
        return PatchStatus(patch.id, "applied", path)
    owner = elsewhere(path)
    if owner is not None:
        return PatchStatus(patch.id, "patched", path, elsewhere_note(*owner))
    if patch.fixed_upstream(release):
        return PatchStatus(
            patch.id, "already upstream", path, f"fixed in {patch.fixed_upstream_in}"
        )
    if patch.id in state.skipped and state.release == str(release):
        return PatchStatus(patch.id, "skipped", path, "left out by choice (apply --skip/--only)")
    note = "" if patch.is_tested(release) else f"untested on {release} (tested: {patch.tested})"
    return PatchStatus(patch.id, "not applied", path, note)


def check(
    target_path: Path | None, ledger_dir: Path | None = None, catalog: Path | None = None
) -> CheckReport:
    """Whether every patch meant for the target's release is in place (`status --check`).

    Judged from the files themselves, by running each codemod in memory: a patch is in place when
    its codemod finds its change already there (written by sglpatch, by `patch -p1` from an
    export, or upstream). Patches the user skipped on this release do not count; nothing is
    written.
    """
    target = find_target(target_path, None, required=False)
    release = target.release
    if release is None:  # status takes no --version: say what is missing instead
        raise UsageError(
            f"cannot tell which SGLang release {target.root} is (no dist-info, version file or "
            "release tag), so which patches it needs"
        )
    record = record_of(target, ledger_dir)
    state = record.state()
    same = state.release == str(release)
    skipped = set(state.skipped) if same else set()
    patches = [p for p in catalogue.load(catalog) if p.id not in skipped]
    plan = engine.plan(target, patches, release, state.patches if same else ())
    in_place, missing, not_needed = [], [], []
    for patch, outcome in zip(patches, plan.outcomes, strict=True):
        if isinstance(outcome, AlreadyApplied):
            in_place.append(patch.id)
        elif isinstance(outcome, NotApplicable):
            not_needed.append(patch.id)
        else:
            untested = "" if patch.is_tested(release) else f"; untested on {release}"
            why = outcome.reason if isinstance(outcome, Failed) else "not applied"
            file = outcome.file if isinstance(outcome, (Applied, Failed)) else None
            missing.append(PatchStatus(patch.id, "not applied", file, why + untested))
    return CheckReport(
        target,
        record.directory,
        tuple(in_place),
        tuple(missing),
        tuple(sorted(skipped)),
        tuple(not_needed),
    )


def log(target_path: Path | None, ledger_dir: Path | None = None) -> LogReport:
    """The ledger's history for the target, newest first."""
    target = find_target(target_path, None, required=False)
    record = record_of(target, ledger_dir)
    return LogReport(target, record.directory, record.ledger.directory, record.repository.history())
