"""`status` (from hashes and the ledger), `status --check` (from the files) and `log`."""

from __future__ import annotations

import stat
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch import catalogue, engine
from sglpatch.api.common import elsewhere_note, record_of
from sglpatch.errors import UsageError
from sglpatch.patch import Patch
from sglpatch.reports import CheckReport, LogReport, PatchStatus, StatusReport
from sglpatch.results import AlreadyApplied, Applied, Failed, NotApplicable
from sglpatch.store import Record, State, file_digest, state_now
from sglpatch.target import Target, find_target, parse_release


def status(
    target_path: Path | None,
    ledger_dir: Path | None = None,
    catalog: Path | None = None,
    release: str | None = None,
) -> StatusReport:
    """Per patch: applied, not applied, already upstream, not for this release or edited.

    Answered from file hashes and the ledger's records: no codemod runs, libcst is not loaded.
    `release` is `--release`, as for apply.
    """
    target, record = _target_and_record(target_path, ledger_dir, release)
    state, interrupted = state_now(record)  # an interrupted change: each file on one side
    foreign: dict[str, tuple[Path, str]] | None = None

    def elsewhere(path: str) -> tuple[Path, str] | None:
        nonlocal foreign
        if foreign is None:
            foreign = record.ledger.foreign(record)
        return foreign.get(path)

    rows = tuple(_status_of(p, target, state, elsewhere) for p in catalogue.load(catalog))
    return StatusReport(target, record.directory, rows, interrupted)


def _target_and_record(
    target_path: Path | None, ledger_dir: Path | None, release: str | None
) -> tuple[Target, Record]:
    """The target, its release settled as apply settles it, and its ledger record.

    A release no file or tag tells (a checkout whose tag is gone) is the one apply was told
    with --release, as the ledger recorded it: status asks what was applied, and the ledger
    knows which release that was for.
    """
    target = find_target(target_path, parse_release(release) if release else None, required=False)
    record = record_of(target, ledger_dir)
    if target.release is None:
        recorded = record.state().release
        try:
            found = Version(recorded) if recorded else None
        except InvalidVersion:  # a hand-edited record: as if there were none
            found = None
        if found is not None:
            source = "the ledger's record of the last apply"
            target = replace(target, release=found, release_source=source)
    return target, record


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
    upgraded = ""
    if patch.id in state.patches and file is not None:
        digest = file_digest(target.root / path)
        if state.release != str(release):  # an upgrade: what is true of the new release's files
            if digest == file.patched:  # pip left the file sglpatch wrote
                note = f"applied to {state.release}; its bytes are still there on {release}"
                return PatchStatus(patch.id, "applied", path, note)
            upgraded = f"applied to {state.release}; the target is now {release} (upgraded)"
        elif digest == file.patched:
            return PatchStatus(patch.id, "applied", path)
        elif digest == file.original:
            return PatchStatus(
                patch.id, "not applied", path, "the original bytes are back (reinstalled?)"
            )
        elif digest == "":
            return PatchStatus(patch.id, "edited since applied", path, "no longer a regular file")
        else:
            return PatchStatus(patch.id, "edited since applied", path)
    elif patch.id in state.patches:
        return PatchStatus(patch.id, "applied", path)
    if _special(target.root / path):  # as `status --check` and apply see it: nothing to judge
        return PatchStatus(patch.id, "not applied", path, "not a regular file")
    # Before another ledger's record of the file: a patch upstream fixed is never applied, even
    # where other patches changed its file.
    if patch.fixed_upstream(release):
        return PatchStatus(
            patch.id, "already upstream", path, f"fixed in {patch.fixed_upstream_in}"
        )
    owner = elsewhere(path)
    if owner is not None:
        return PatchStatus(patch.id, "patched", path, elsewhere_note(*owner))
    if patch.id in state.skipped and state.release == str(release):
        return PatchStatus(patch.id, "skipped", path, "left out by choice (apply --skip/--only)")
    untested = "" if patch.is_tested(release) else f"untested on {release} (tested: {patch.tested})"
    return PatchStatus(
        patch.id, "not applied", path, "; ".join(x for x in (upgraded, untested) if x)
    )


def check(
    target_path: Path | None,
    ledger_dir: Path | None = None,
    catalog: Path | None = None,
    release_asked: str | None = None,
) -> CheckReport:
    """Whether every patch meant for the target's release is in place (`status --check`).

    Judged from hashes first: a file holding the bytes the ledger recorded sglpatch wrote on this
    release is in place for the patches recorded on it, and a patch the release has upstream (in
    its tested range, where the test matrix proves the declaration) needs no look. Every other
    patch's codemod runs in memory and must find its change already there (written by sglpatch,
    by `patch -p1` from an export, or upstream), so libcst is loaded only when the ledger cannot
    vouch for a file. Patches the user skipped on this release do not count; nothing is written.
    `release_asked` is `--release`, as for apply.
    """
    target, record = _target_and_record(target_path, ledger_dir, release_asked)
    release = target.release
    if release is None:
        raise UsageError(
            f"cannot tell which SGLang release {target.root} is (no dist-info, version file, "
            "release tag or ledger record), so which patches it needs; pass --release"
        )
    state = record.state()
    same = state.release == str(release)
    skipped = set(state.skipped) if same else set()
    patches = [p for p in catalogue.load(catalog) if p.id not in skipped]
    applied, upstream, not_needed, unvouched = _vouch(
        target, release, state if same else None, patches
    )
    plan = engine.plan(target, unvouched, release, state.patches if same else ())
    missing = []
    upgraded = state.release if state.files and not same else None
    for patch, outcome in zip(unvouched, plan.outcomes, strict=True):
        if isinstance(outcome, AlreadyApplied):
            (upstream if patch.fixed_upstream(release) else applied).add(patch.id)
        elif isinstance(outcome, NotApplicable):
            not_needed.add(patch.id)
        else:
            untested = "" if patch.is_tested(release) else f"; untested on {release}"
            why = outcome.reason if isinstance(outcome, Failed) else "not applied"
            file = outcome.file if isinstance(outcome, (Applied, Failed)) else None
            missing.append(PatchStatus(patch.id, "not applied", file, why + untested))
    order = [p.id for p in patches]
    return CheckReport(
        target,
        record.directory,
        tuple(i for i in order if i in applied or i in upstream),
        tuple(missing),
        tuple(sorted(skipped)),
        tuple(i for i in order if i in not_needed),
        tuple(i for i in order if i in upstream),
        upgraded,
    )


def _vouch(
    target: Target, release: Version, state: State | None, patches: list[Patch]
) -> tuple[set[str], set[str], set[str], list[Patch]]:
    """What hashes and declarations settle: the patches in place (applied, upstream), those not
    for this release, and those whose codemod must look. `state`: the record of this release."""
    applied: set[str] = set()
    upstream: set[str] = set()
    not_needed: set[str] = set()
    unvouched: list[Patch] = []
    digests: dict[str, str | None] = {}
    for patch in patches:
        package_path = patch.package_file(release)
        if package_path is None:
            not_needed.add(patch.id)
            continue
        path = target.relative(package_path)
        file = state.files.get(path) if state is not None else None
        if file is not None and patch.id in file.patches:
            if path not in digests:
                digests[path] = file_digest(target.root / path)
            if digests[path] == file.patched:
                applied.add(patch.id)
                continue
        elif (
            patch.fixed_upstream(release)
            and patch.is_tested(release)
            and _regular(target.root / path)  # a missing file is the codemod's to report
        ):
            upstream.add(patch.id)
            continue
        unvouched.append(patch)
    return applied, upstream, not_needed, unvouched


def _regular(path: Path) -> bool:
    return path.is_file() and not path.is_symlink()


def log(target_path: Path | None, ledger_dir: Path | None = None) -> LogReport:
    """The ledger's history for the target, newest first."""
    target = find_target(target_path, None, required=False)
    record = record_of(target, ledger_dir)
    return LogReport(target, record.directory, record.ledger.directory, record.history())


def _special(path: Path) -> bool:
    """There, but not a regular file (a FIFO, a device): one `stat`, nothing opened."""
    try:
        return not stat.S_ISREG(path.stat().st_mode)
    except OSError:
        return False
