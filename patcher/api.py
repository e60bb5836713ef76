"""What the commands do, as plain functions returning values; no terminal code here."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import __version__, catalogue, diff, engine, journal
from sglpatch.errors import LedgerError, RefusedError, UsageError
from sglpatch.fsio import write_atomic
from sglpatch.ledger import Entry, FileRecord, Ledger, Record, State, default_directory, sha256
from sglpatch.patch import Patch
from sglpatch.reports import (
    ApplyReport,
    CatalogueRow,
    DoctorReport,
    ExportReport,
    PatchStatus,
    Preview,
    RevertReport,
    StatusReport,
)
from sglpatch.results import Applied, Outcome
from sglpatch.target import Target, find_target, parse_release

__all__ = [
    "ApplyReport",
    "CatalogueRow",
    "DoctorReport",
    "ExportReport",
    "PatchStatus",
    "Preview",
    "RevertReport",
    "StatusReport",
    "apply",
    "diagnose",
    "export",
    "list_patches",
    "log",
    "preview",
    "revert",
    "status",
]


def apply(
    target_path: Path | None,
    version: str | None,
    ledger_dir: Path | None = None,
    *,
    dry_run: bool = False,
    force: bool = False,
    catalog: Path | None = None,
    only: Collection[str] | None = None,
) -> ApplyReport:
    """Apply every patch for the target's release (or those in `only`), all or nothing,
    recording it first."""
    target = find_target(target_path, parse_release(version) if version else None)
    release = _release(target)
    patches, untested = _patches_for(release, catalog, force, only)
    record = _record(target, ledger_dir)
    if dry_run:
        return _plan_apply(record, target, release, patches, untested, write=False, finished=None)
    with record.locked():
        finished = journal.finish_interrupted(record, target)
        return _plan_apply(
            record, target, release, patches, untested, write=True, finished=finished
        )


def _patches_for(
    release: Version, catalog: Path | None, force: bool, only: Collection[str] | None = None
) -> tuple[list[Patch], tuple[str, ...]]:
    """The catalogue to run, refusing a release outside a patch's tested range unless forced."""
    patches = catalogue.load(catalog)
    if only is not None:
        unknown = set(only) - {p.id for p in patches}
        if unknown:
            raise UsageError(f"no patch called {', '.join(sorted(unknown))} in the catalogue")
        patches = [p for p in patches if p.id in only]
    untested = tuple(p.id for p in patches if not p.is_tested(release))
    if untested and not force:
        ranges = "; ".join(f"{p.id}: {p.tested}" for p in patches if p.id in untested)
        raise RefusedError(
            f"SGLang {release} is outside the tested releases ({ranges}); "
            "--force runs the codemods anyway"
        )
    return patches, untested


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
    ours = set(state.patches) if same else set()
    ours |= {o.patch_id for o in outcomes if isinstance(o, Applied)}
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
    record = _record(target, ledger_dir)
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


def status(
    target_path: Path | None, ledger_dir: Path | None = None, catalog: Path | None = None
) -> StatusReport:
    """Per patch: applied, not applied, already upstream, not for this release or edited.

    Answered from file hashes and the ledger's records: no codemod runs, libcst is not loaded.
    """
    target = find_target(target_path, None, required=False)
    record = _record(target, ledger_dir)
    state = record.state()
    rows = tuple(_status_of(p, target, state) for p in catalogue.load(catalog))
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
    record = _record(target, ledger_dir)
    return record, record.history()


def list_patches(release: str | None = None, catalog: Path | None = None) -> list[CatalogueRow]:
    """The catalogue; with `release`, what apply would do on it (without looking at any files)."""
    version = parse_release(release) if release else None
    return [_row(p, version) for p in catalogue.load(catalog)]


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


def _record(target: Target, ledger_dir: Path | None) -> Record:
    return Ledger(ledger_dir or default_directory()).record(target)


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


def diagnose(
    target_path: Path | None,
    model: str | None = None,
    catalog: Path | None = None,
    *,
    model_path: Path | None = None,
    strict: bool = False,
    progress: Callable[[str], None] | None = None,
) -> DoctorReport:
    """Will the target run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`) or a models module's
    stem (`kimi_k25`); `model_path` is a checkpoint folder whose config.json names it.
    """
    target = find_target(target_path, None, required=False)
    if model_path is not None:
        if model is not None:
            raise UsageError("give --model or --model-path, not both")
        model = _architecture(model_path)
    from sglpatch import doctor  # its scanners load only for this command

    result = doctor.diagnose(
        target.package_dir,
        target.release,
        catalogue.load(catalog),
        model,
        strict=strict,
        progress=progress,
    )
    return DoctorReport(target, result)


def _architecture(model_path: Path) -> str:
    """The first architecture a checkpoint's config.json names, as SGLang picks its class."""
    import json

    config = model_path / "config.json"
    try:
        data = json.loads(config.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--model-path {model_path}: no config.json there") from None
    except (OSError, ValueError) as error:
        raise UsageError(f"--model-path {model_path}: cannot read config.json: {error}") from None
    names = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"--model-path {model_path}: config.json names no architectures")
    return names[0]


def export(
    target_path: Path | None,
    version: str,
    output: str,
    ledger_dir: Path | None = None,
    *,
    force: bool = False,
    catalog: Path | None = None,
) -> ExportReport:
    """The diff `apply` would make on a pristine tree of this release, written to `output`.

    Files sglpatch already patched are diffed from their recorded originals, so the export is
    the same whether or not the target is patched now. Nothing in the target is written.
    """
    target = find_target(target_path, parse_release(version))
    release = _release(target)
    patches, _ = _patches_for(release, catalog, force)
    record = _record(target, ledger_dir)
    state = record.state()
    pristine: dict[str, bytes] = {}
    if state.release == str(release):
        for path, file in state.files.items():
            current = _read(target.root / path)
            if current is not None and sha256(current) == file.patched:
                pristine[path] = record.stored("original", path)
    plan = engine.plan(target, patches, release, (), sources=pristine)
    text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
    report = ExportReport(target, text, tuple(c.path for c in plan.changes), plan.outcomes, output)
    if not report.failures and output != "-":
        try:
            write_atomic(Path(output), text.encode("utf-8"))
        except OSError as error:
            raise UsageError(f"cannot write {output}: {error.strerror}") from None
    return report


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
    release = _release(target)
    patches, _ = _patches_for(release, catalog, force)
    state = _record(target, ledger_dir).state()
    ours = state.patches if state.release == str(release) else []
    previews = []
    for patch in patches:
        plan = engine.plan(target, [patch], release, ours)
        text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
        previews.append(Preview(patch.id, patch.description, plan.outcomes[0], text))
    return previews
