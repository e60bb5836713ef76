"""What the commands do, as plain functions returning values; no terminal code here."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sglpatch import __version__, catalogue, diff, engine, journal
from sglpatch.errors import LedgerError, RefusedError
from sglpatch.ledger import Entry, FileRecord, Ledger, Record, State, default_directory, sha256
from sglpatch.patch import Patch
from sglpatch.results import AlreadyApplied, Applied, Failed, Outcome
from sglpatch.target import Target, find_target, parse_release


@dataclass(frozen=True)
class ApplyReport:
    target: Target
    ledger: Path
    outcomes: tuple[Outcome, ...]
    diff: str
    changed: tuple[str, ...]
    written: bool
    commit: str | None
    untested: tuple[str, ...]  # patches run outside their tested releases (--force)
    finished: str | None = None  # an interrupted apply or revert that this run completed first

    @property
    def failures(self) -> list[Failed]:
        return [o for o in self.outcomes if isinstance(o, Failed)]


@dataclass(frozen=True)
class RevertReport:
    target: Target
    ledger: Path
    restored: tuple[str, ...]
    untouched: tuple[str, ...]  # already back to the original bytes (e.g. after a reinstall)
    saved_edits: tuple[str, ...]  # edited files whose bytes --force kept in the ledger
    commit: str | None
    finished: str | None = None


@dataclass(frozen=True)
class PatchStatus:
    id: str
    # applied, not applied, already upstream, not for this release, edited since applied
    state: str
    file: str | None
    note: str = ""


@dataclass(frozen=True)
class StatusReport:
    target: Target
    ledger: Path
    patches: tuple[PatchStatus, ...]
    interrupted: str | None = None  # an apply or revert killed half-way, finished by the next run


@dataclass(frozen=True)
class CatalogueRow:
    id: str
    description: str
    tested: str
    fixed_upstream_in: str | None
    origin: str
    file: str | None  # for `release`, if given
    outlook: str | None  # what apply would do on `release`, if given


def apply(
    target_path: Path | None,
    version: str | None,
    ledger_dir: Path | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
) -> ApplyReport:
    """Apply every patch for the target's release, all or nothing, recording it first."""
    target = find_target(target_path, parse_release(version) if version else None)
    release = _release(target)
    patches = catalogue.load()
    untested = tuple(p.id for p in patches if not p.is_tested(release))
    if untested and not force:
        ranges = "; ".join(f"{p.id}: {p.tested}" for p in patches if p.id in untested)
        raise RefusedError(
            f"SGLang {release} is outside the tested releases ({ranges}); "
            "--force runs the codemods anyway"
        )
    record = Ledger(ledger_dir or default_directory()).record(target)
    if dry_run:
        return _plan_apply(record, target, release, patches, untested, write=False, finished=None)
    with record.locked():
        finished = journal.finish_interrupted(record, target)
        return _plan_apply(
            record, target, release, patches, untested, write=True, finished=finished
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
) -> ApplyReport:
    state = record.state()
    ours = state.patches if state.release == str(release) else []
    plan = engine.plan(target, patches, release, ours)
    text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
    changed = tuple(c.path for c in plan.changes)
    commit = None
    if write and plan.changes and not plan.failures:
        patch_ids = [p for c in plan.changes for p in c.patch_ids]
        change = journal.Change(
            "apply",
            _message("apply", target, release, patch_ids),
            _applied_state(state, release, plan.outcomes, plan.changes),
            {
                **{f"original/{c.path}": c.before for c in plan.changes},
                **{f"patched/{c.path}": c.after for c in plan.changes},
            },
            tuple(journal.Write(c.path, sha256(c.before), c.after) for c in plan.changes),
        )
        commit = journal.carry_out(record, target, change)
    return ApplyReport(
        target,
        record.directory,
        plan.outcomes,
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
) -> State:
    """The state after this apply; a record from another release (an upgrade) starts afresh."""
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
    ours = {o.patch_id for o in outcomes if isinstance(o, Applied)}
    ours |= {o.patch_id for o in outcomes if isinstance(o, AlreadyApplied) and o.by == "sglpatch"}
    return State(str(release), sorted(ours), files)


def revert(
    target_path: Path | None, ledger_dir: Path | None = None, *, force: bool = False
) -> RevertReport:
    """Put back the recorded original bytes of every file sglpatch changed.

    A file whose bytes are neither what sglpatch wrote nor the original was edited (or replaced
    by an upgrade) since: refuse and name it, unless `force`, which first keeps those bytes in
    the ledger.
    """
    target = find_target(target_path, None, required=False)
    record = Ledger(ledger_dir or default_directory()).record(target)
    with record.locked():
        finished = journal.finish_interrupted(record, target)
        done = finished.action if finished else None
        state = record.state()
        if not state.files:
            return RevertReport(target, record.directory, (), (), (), None, done)
        writes: list[journal.Write] = []
        untouched: list[str] = []
        edited: dict[str, bytes] = {}
        for path, file in sorted(state.files.items()):
            current = _read(target.root / path)
            original = record.stored("original", path)
            if sha256(original) != file.original:
                raise LedgerError(
                    f"the recorded original of {path} is damaged", str(record.directory)
                )
            digest = sha256(current) if current is not None else None
            if digest == file.original:
                untouched.append(path)
                continue
            if current is None and not force:
                raise RefusedError(f"{path} is missing; revert --force recreates it")
            if current is not None and digest != file.patched:
                edited[path] = current
            writes.append(journal.Write(path, digest, original))
        if edited and not force:
            raise RefusedError(_edited_message(target, state, sorted(edited)))
        change = journal.Change(
            "revert",
            _message("revert", target, target.release, state.patches),
            State(state.release),
            {f"edited/{path}": data for path, data in edited.items()},
            tuple(writes),
        )
        commit = journal.carry_out(record, target, change)
        return RevertReport(
            target,
            record.directory,
            tuple(w.path for w in writes),
            tuple(untouched),
            tuple(sorted(edited)),
            commit,
            done,
        )


def _edited_message(target: Target, state: State, edited: list[str]) -> str:
    if target.release is not None and state.release not in (None, str(target.release)):
        return (
            f"the target is now SGLang {target.release} but the ledger's patches were applied to "
            f"{state.release}; reverting would write {state.release} files over it "
            f"({', '.join(edited)}). Nothing changed; revert --force does it anyway"
        )
    return (
        f"{', '.join(edited)} changed since sglpatch patched it; nothing was reverted. "
        "revert --force keeps the edited bytes in the ledger, then restores the original"
    )


def status(target_path: Path | None, ledger_dir: Path | None = None) -> StatusReport:
    """Per patch: applied, not applied, already upstream, not for this release or edited.

    Answered from file hashes and the ledger's records: no codemod runs, libcst is not loaded.
    """
    target = find_target(target_path, None, required=False)
    record = Ledger(ledger_dir or default_directory()).record(target)
    state = record.state()
    rows = tuple(_status_of(p, target, state) for p in catalogue.load())
    return StatusReport(target, record.directory, rows, journal.pending(record))


def _status_of(patch: Patch, target: Target, state: State) -> PatchStatus:
    release = target.release
    if release is None:
        return PatchStatus(patch.id, "unknown", None, "the target's release is unknown")
    package_path = patch.target_file(release)
    if package_path is None:
        return PatchStatus(patch.id, "not for this release", None)
    path = target.relative(package_path)
    file = state.files.get(path)
    if patch.id in state.patches and file is not None:
        current = _read(target.root / path)
        digest = sha256(current) if current is not None else None
        if state.release != str(release):
            note = f"applied to {state.release}; the target is now {release} (upgraded)"
            return PatchStatus(patch.id, "not applied", path, note)
        if digest == file.patched:
            return PatchStatus(patch.id, "applied", path)
        if digest == file.original:
            return PatchStatus(
                patch.id, "not applied", path, "the original bytes are back (reinstalled?)"
            )
        return PatchStatus(patch.id, "edited since applied", path)
    if patch.id in state.patches:
        return PatchStatus(patch.id, "applied", path)
    if patch.fixed_upstream(release):
        return PatchStatus(
            patch.id, "already upstream", path, f"fixed in {patch.fixed_upstream_in}"
        )
    note = "" if patch.is_tested(release) else f"untested on {release} (tested: {patch.tested})"
    return PatchStatus(patch.id, "not applied", path, note)


def log(target_path: Path | None, ledger_dir: Path | None = None) -> tuple[Record, list[Entry]]:
    """The ledger's history for the target, newest first."""
    target = find_target(target_path, None, required=False)
    record = Ledger(ledger_dir or default_directory()).record(target)
    return record, record.history()


def list_patches(release: str | None = None) -> list[CatalogueRow]:
    """The catalogue; with `release`, what apply would do on it (without looking at any files)."""
    version = parse_release(release) if release else None
    return [_row(p, version) for p in catalogue.load()]


def _row(patch: Patch, release: Version | None) -> CatalogueRow:
    fixed = str(patch.fixed_upstream_in) if patch.fixed_upstream_in else None
    if release is None:
        return CatalogueRow(
            patch.id, patch.description, str(patch.tested), fixed, patch.origin, None, None
        )
    package_path = patch.target_file(release)
    if not patch.is_tested(release):
        outlook = f"refused: untested on {release} (--force runs it)"
    elif package_path is None:
        outlook = "not for this release"
    elif patch.fixed_upstream(release):
        outlook = f"already upstream (fixed in {fixed})"
    else:
        outlook = "applies"
    file = f"sglang/{package_path}" if package_path else None
    return CatalogueRow(
        patch.id, patch.description, str(patch.tested), fixed, patch.origin, file, outlook
    )


def _release(target: Target) -> Version:
    assert target.release is not None  # find_target(required=True) settles it
    return target.release


def _read(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None


def _message(action: str, target: Target, release: Version | None, patch_ids: list[str]) -> str:
    ids = ", ".join(sorted(set(patch_ids))) or "-"
    return (
        f"{action}: {ids} (SGLang {release})\n\n"
        f"target: {target.root}\n"
        f"release: {release}\n"
        f"patches: {ids}\n"
        f"sglpatch: {__version__}\n"
    )
