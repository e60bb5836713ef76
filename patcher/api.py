"""What the commands do, as plain functions returning values; no terminal code here."""

from __future__ import annotations

from collections.abc import Callable, Collection
from pathlib import Path

from packaging.version import Version

from sglpatch import __version__, catalogue, diff, engine
from sglpatch.errors import LedgerError, RefusedError, UsageError
from sglpatch.patch import Patch
from sglpatch.reading import NotRegularFile, read_regular
from sglpatch.reports import (
    ApplyReport,
    CatalogueRow,
    CheckReport,
    DoctorReport,
    ExportReport,
    PatchStatus,
    Preview,
    RevertReport,
    StatusReport,
)
from sglpatch.results import AlreadyApplied, Applied, Failed, NotApplicable, Outcome
from sglpatch.store import (
    Entry,
    FileRecord,
    Ledger,
    Record,
    State,
    default_directory,
    journal,
    sha256,
)
from sglpatch.store.fsio import write_atomic
from sglpatch.target import Target, find_target, parse_release

__all__ = [
    "ApplyReport",
    "CatalogueRow",
    "CheckReport",
    "DoctorReport",
    "ExportReport",
    "PatchStatus",
    "Preview",
    "RevertReport",
    "StatusReport",
    "apply",
    "check",
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
    release = _release(target)
    patches, untested, left_out = _patches_for(release, catalog, force, only, skip)
    left_out = left_out if record_skipped else ()
    record = _record(target, ledger_dir)
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


def _patches_for(
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
            _message("apply", target, release, patch_ids, after.skipped),
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
        _owned_elsewhere(record, plan.outcomes),
        text,
        changed,
        commit is not None,
        commit,
        untested,
        finished.action if finished else None,
    )


def _owned_elsewhere(record: Record, outcomes: tuple[Outcome, ...]) -> tuple[Outcome, ...]:
    """ "Already upstream" is wrong for a file another ledger record says sglpatch patched."""
    if not any(isinstance(o, AlreadyApplied) and o.by == "upstream" for o in outcomes):
        return outcomes
    foreign = record.ledger.foreign(record)
    return tuple(
        AlreadyApplied(o.patch_id, o.file, "sglpatch", _elsewhere(*foreign[o.file]))
        if isinstance(o, AlreadyApplied) and o.by == "upstream" and o.file in foreign
        else o
        for o in outcomes
    )


def _elsewhere(folder: Path, owner: str) -> str:
    return f"recorded in another ledger at {folder} (target {owner})"


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
    record.repository.require_git()
    with record.locked():
        finished = journal.finish_interrupted(record, target, or_undo=True)
        done = finished.action if finished else None
        state = record.state()
        if not state.files:
            _refuse_foreign(record)
            return RevertReport(target, record.directory, (), (), (), None, done)
        writes: list[journal.Write] = []
        untouched: list[str] = []
        edited: dict[str, bytes] = {}
        replaced: list[str] = []  # no longer regular files: never written over, even forced
        for path, file in sorted(state.files.items()):
            location = record.locate(path)
            digest = journal.current(location)
            now = _read(location) if digest else None
            original = record.stored("original", path)
            if sha256(original) != file.original:
                raise LedgerError(
                    f"the recorded original of {path} is damaged", str(record.directory)
                )
            if digest == file.original:
                untouched.append(path)
                continue
            if digest == "":
                replaced.append(path)
                continue
            if digest is None and not force:
                raise RefusedError(f"{path} is missing; revert --force recreates it")
            if now is not None and digest != file.patched:
                edited[path] = now
            writes.append(journal.Write(path, digest, original, now))
        if (edited or replaced) and not force:
            raise RefusedError(_edited_message(target, state, sorted(edited), replaced))
        kept = {path: state.files[path] for path in replaced}
        change = journal.Change(
            "revert",
            _message("revert", target, target.release, state.patches),
            State(
                state.release,
                sorted({p for f in kept.values() for p in f.patches}),
                kept,
                extra=state.extra,
            ),
            {f"edited/{path}": data for path, data in edited.items()},
            tuple(writes),
            previous=state,
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
            tuple(replaced),
        )


def _refuse_foreign(record: Record) -> None:
    """Nothing recorded here: "nothing to revert" would be wrong if another record patched it."""
    foreign = record.ledger.foreign(record)
    if foreign:
        folder, owner = next(iter(foreign.values()))
        raise RefusedError(
            f"{', '.join(sorted(foreign))} hold bytes sglpatch wrote, {_elsewhere(folder, owner)}"
            f"; this ledger has no record of them. Run revert with --ledger "
            f"{folder.parent.parent} --target {owner}, or move the tree back"
        )


def _edited_message(target: Target, state: State, edited: list[str], replaced: list[str]) -> str:
    if replaced:
        gone = ", ".join(replaced)
        also = f"; {', '.join(edited)} changed since sglpatch patched it" if edited else ""
        return (
            f"{gone} is no longer a regular file{also}; nothing was reverted. revert --force "
            "restores the rest and leaves it (its original bytes stay in the ledger)"
        )
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
        return PatchStatus(patch.id, "patched", path, _elsewhere(*owner))
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
    record = _record(target, ledger_dir)
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


def log(target_path: Path | None, ledger_dir: Path | None = None) -> tuple[Record, list[Entry]]:
    """The ledger's history for the target, newest first."""
    target = find_target(target_path, None, required=False)
    record = _record(target, ledger_dir)
    return record, record.repository.history()


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
    package_path = patch.package_file(release)
    if not patch.is_tested(release):
        effect, outlook = "refused", f"refused: untested on {release} (--force runs it)"
    elif package_path is None:
        effect = outlook = "not for this release"
    elif patch.fixed_upstream(release):
        effect, outlook = "already upstream", f"already upstream (fixed in {fixed})"
    else:
        effect = outlook = "applies"
    file = f"sglang/{package_path}" if package_path else None
    return CatalogueRow(
        patch.id, patch.description, str(patch.tested), fixed, patch.origin, file, outlook, effect
    )


def _record(target: Target, ledger_dir: Path | None) -> Record:
    return Ledger(ledger_dir or default_directory()).record(target)


def _release(target: Target) -> Version:
    if target.release is None:  # find_target(required=True) settles it; never guess
        raise UsageError(f"cannot tell which SGLang release {target.root} is; pass --version")
    return target.release


def _read(path: Path) -> bytes | None:
    """A regular file's bytes; None if it is missing or not a regular file."""
    try:
        return read_regular(path)
    except (FileNotFoundError, NotRegularFile):
        return None


def _message(
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


def diagnose(
    target_path: Path | None,
    model: str | None = None,
    catalog: Path | None = None,
    *,
    model_path: Path | None = None,
    strict: bool = False,
    progress: Callable[[str], None] | None = None,
    version: str | None = None,
) -> DoctorReport:
    """Will the target run on capability-12 GPUs (with EAGLE-3 on `model`)? From its own source.

    `model` is an architecture name (`KimiK25ForConditionalGeneration`) or a models module's
    stem (`kimi_k25`); `model_path` is a checkpoint folder whose config.json names it. A release
    that cannot be read is a usage error unless `version` gives it: which patches the tree
    needs depends on it, so "ready" could not be known.
    """
    target = find_target(target_path, parse_release(version) if version else None)
    if model_path is not None:
        if model is not None:
            raise UsageError("give --model or --model-path, not both")
        model = _architecture(model_path)
    from sglpatch import warmup
    from sglpatch.doctor import verdict  # its scanners load only for this command

    if target.release is not None:  # always, found or given
        warmup.submit(target.package_dir, target.release, catalog)
    try:
        result = verdict.diagnose(
            target.package_dir,
            target.release,
            catalogue.load(catalog),
            model,
            strict=strict,
            progress=progress,
        )
    finally:
        warmup.stop()  # answered, not needed, or the diagnosis failed: it ends here
    return DoctorReport(target, result)


def _architecture(model_path: Path) -> str:
    """The first architecture a checkpoint's config.json names, as SGLang picks its class."""
    import json

    from sglpatch.doctor.census import is_model_name, shown_name

    config = model_path / "config.json"
    limit = 64 << 20  # bytes: a checkpoint's config.json is a few KB; never a FIFO's wait
    try:
        data = json.loads(read_regular(config, limit).decode("utf-8"))
    except FileNotFoundError:
        raise UsageError(f"--model-path {model_path}: no config.json there") from None
    except OSError as error:
        why = error.strerror or str(error)
        raise UsageError(f"--model-path {model_path}: cannot read config.json: {why}") from None
    except RecursionError:
        raise UsageError(
            f"--model-path {model_path}: cannot read config.json: nested too deeply"
        ) from None
    except ValueError as error:  # not UTF-8, not JSON
        why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UsageError(f"--model-path {model_path}: cannot read config.json: {why}") from None
    names = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"--model-path {model_path}: config.json names no architectures")
    if not is_model_name(names[0]):
        raise UsageError(
            f"--model-path {model_path}: config.json's architecture "
            f"{shown_name(names[0])} is not a class name"
        )
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
    patches, _, _ = _patches_for(release, catalog, force)
    record = _record(target, ledger_dir)
    if output != "-":
        _refuse_output_inside(Path(output), target, record)
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


def _refuse_output_inside(output: Path, target: Target, record: Record) -> None:
    """The diff must never overwrite a file of the target or of the ledger."""
    where = output.resolve()
    for protected, what in ((target.root, "target"), (record.ledger.directory, "ledger")):
        if where.is_relative_to(protected.resolve()):
            raise RefusedError(
                f"--output {output} is inside the {what} {protected}; write it elsewhere"
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
    release = _release(target)
    patches, _, _ = _patches_for(release, catalog, force)
    state = _record(target, ledger_dir).state()
    ours = state.patches if state.release == str(release) else []
    previews = []
    for patch in patches:
        plan = engine.plan(target, [patch], release, ours)
        text = "".join(diff.unified(c.path, c.before, c.after) for c in plan.changes)
        previews.append(Preview(patch.id, patch.description, plan.outcomes[0], text))
    return previews
