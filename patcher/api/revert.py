"""`revert`: every file sglpatch changed gets its recorded original bytes back."""

from __future__ import annotations

from pathlib import Path
from typing import NamedTuple

from sglpatch.api.common import commit_message, elsewhere_note, read_or_none, record_of
from sglpatch.errors import RefusedError
from sglpatch.reports import RevertReport
from sglpatch.store import Record, State, journal
from sglpatch.target import Target, find_target


def revert(
    target_path: Path | None, ledger_dir: Path | None = None, *, force: bool = False
) -> RevertReport:
    """Put back the recorded original bytes of every file sglpatch changed.

    A file whose bytes are neither what sglpatch wrote nor the original was edited (or replaced
    by an upgrade) since: refuse and name it, unless `force`, which first keeps those bytes in
    the ledger.
    """
    target = find_target(target_path, None, required=False)
    record = record_of(target, ledger_dir)
    record.repository.require_git()
    with record.locked():
        finished = journal.finish_interrupted(record, target, or_undo=True)
        done = finished.action if finished else None
        state = record.state()
        if not state.files:
            _refuse_foreign(record)
            return RevertReport(target, record.directory, (), (), (), None, done)
        plan = _plan(record, state, force)
        writes, untouched, edited, replaced = (
            plan.writes,
            plan.untouched,
            plan.edited,
            plan.replaced,
        )
        if (edited or replaced) and not force:
            raise _refusal(target, state, sorted(edited), replaced)
        kept = {path: state.files[path] for path in replaced}
        still = {p for f in kept.values() for p in f.patches}
        change = journal.Change(
            "revert",
            commit_message("revert", target, target.release, state.patches),
            State(
                state.release,
                sorted(still),
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
            tuple(p for p in state.patches if p not in still),
        )


class _Plan(NamedTuple):
    writes: list[journal.Write]
    untouched: list[str]  # already back to the original bytes
    edited: dict[str, bytes]  # changed since sglpatch patched them: their bytes, kept if forced
    replaced: list[str]  # no longer regular files: never written over, even forced


def _plan(record: Record, state: State, force: bool) -> _Plan:
    """What reverting each recorded file takes, judged from its bytes now."""
    plan = _Plan([], [], {}, [])
    for path, file in sorted(state.files.items()):
        location = record.locate(path)
        digest = journal.current(location)
        now = read_or_none(location) if digest else None
        original = record.stored("original", path, file.original)
        if digest == file.original:
            plan.untouched.append(path)
            continue
        if digest == "":
            plan.replaced.append(path)
            continue
        if digest is None and not force:
            raise RefusedError(f"{path} is missing; revert --force recreates it")
        if now is not None and digest != file.patched:
            plan.edited[path] = now
        plan.writes.append(journal.Write(path, digest, original, now))
    return plan


def _refuse_foreign(record: Record) -> None:
    """Nothing recorded here: "nothing to revert" would be wrong if another record patched it."""
    foreign = record.ledger.foreign(record)
    if foreign:
        folder, owner = next(iter(foreign.values()))
        raise RefusedError(
            f"{', '.join(sorted(foreign))} hold bytes sglpatch wrote, "
            f"{elsewhere_note(folder, owner)}"
            f"; this ledger has no record of them. Run revert with --ledger "
            f"{folder.parent.parent} --target {owner}, or move the tree back"
        )


class UpgradedSince(RefusedError):
    """The target is another release than the one the ledger's patches were applied to.

    The safe step is an apply for the new release (the old record stays in the ledger's
    history); `advice` names it, with the commands spelled as the user typed them.
    """

    def __init__(self, recorded: str, now: str, files: list[str]) -> None:
        self.recorded, self.now, self.files = recorded, now, files
        super().__init__(self.advice("sglpatch apply", "sglpatch revert --force"))

    def advice(self, apply: str, force: str) -> str:
        return (
            f"the target is now SGLang {self.now} but the ledger's patches were applied to "
            f"{self.recorded}; reverting would write {self.recorded} files over it "
            f"({', '.join(self.files)}). Nothing changed. To patch {self.now}, run {apply} (the "
            f"{self.recorded} record stays in the ledger's history); {force} writes the "
            f"{self.recorded} files over {self.now} anyway"
        )


def _refusal(target: Target, state: State, edited: list[str], replaced: list[str]) -> RefusedError:
    if replaced:
        gone = ", ".join(replaced)
        also = f"; {', '.join(edited)} changed since sglpatch patched it" if edited else ""
        return RefusedError(
            f"{gone} is no longer a regular file{also}; nothing was reverted. revert --force "
            "restores the rest and leaves it (its original bytes stay in the ledger)"
        )
    if target.release is not None and state.release not in (None, str(target.release)):
        return UpgradedSince(str(state.release), str(target.release), edited)
    return RefusedError(
        f"{', '.join(edited)} changed since sglpatch patched it; nothing was reverted. "
        "revert --force keeps the edited bytes in the ledger, then restores the original"
    )
