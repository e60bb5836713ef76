"""What apply, revert and status ask of the ledger, said in the commands' words.

The commands (`sglpatch.api`) decide what changes in the target; this module turns that into the
ledger's own terms and carries it out: the state after the change, the bytes kept under the
record's `files/` (`original/`, `patched/`, `edited/`), the commit message, the journal. Nothing
above `store/` names a path inside a record or builds a journaled change.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from pathlib import Path
from typing import NamedTuple, Protocol

from packaging.version import Version

from sglpatch import __version__
from sglpatch.errors import RefusedError
from sglpatch.reading import NotRegularFile, read_regular
from sglpatch.store import journal
from sglpatch.store.fsio import sha256
from sglpatch.store.ledger import Record
from sglpatch.store.state import FileRecord, State


class FileChange(Protocol):
    """A file a command rewrites, as the engine plans it; `path` is relative to the target root."""

    @property
    def path(self) -> str: ...
    @property
    def before(self) -> bytes: ...
    @property
    def after(self) -> bytes: ...
    @property
    def patch_ids(self) -> tuple[str, ...]: ...


def finish_interrupted(record: Record, *, or_undo: bool = False) -> str | None:
    """Finish a change a killed run left (with `or_undo`, undo it if it cannot be finished);
    the action it was (apply or revert), or None if none was waiting. Call it holding the lock."""
    finished = journal.finish_interrupted(record, record.target, or_undo=or_undo)
    return finished.action if finished else None


def state_now(record: Record) -> tuple[State, str | None]:
    """What is applied now, and the action of an interrupted change still waiting ("unknown"
    if its journal cannot be read). Until it is finished, each file is on one side of it."""
    state = record.state()
    interrupted = journal.pending(record)
    if interrupted is not None and interrupted != "unknown":
        change = journal.load(record)
        if change is not None:
            state = journal.effective_state(record, record.target, change)
    return state, interrupted


def originals_of_patched(record: Record, release: Version) -> dict[str, bytes]:
    """The recorded original bytes of each file that holds what sglpatch wrote on `release`."""
    state = record.state()
    found: dict[str, bytes] = {}
    if state.release == str(release):
        for path, file in state.files.items():
            now = _read_or_none(record.target.root / path)
            if now is not None and sha256(now) == file.patched:
                found[path] = record.original(path, file.original)
    return found


def record_apply(
    record: Record,
    state: State,
    release: Version,
    changes: Sequence[FileChange],
    applied: Iterable[str],
    left_out: Collection[str] = (),
) -> str | None:
    """Record an apply and write its files, as one journaled change; the ledger's commit.

    `state` is the record the plan was made from, `applied` the patches it applied now and
    `left_out` those the user chose to skip. None when there is nothing new to record: no file
    changes and no new choice to skip.
    """
    after = _applied_state(state, release, changes, applied, left_out)
    # A new choice to skip is recorded even when no file changes, unless the record holds
    # another release's files (an upgrade), which only a real apply may start afresh.
    newly_skipped = after.skipped != state.skipped and state.release in (None, str(release))
    if not (changes or newly_skipped):
        return None
    patch_ids = [p for c in changes for p in c.patch_ids]
    change = journal.Change(
        "apply",
        _message("apply", record, release, patch_ids, after.skipped),
        after,
        {
            # A patch added on top of our own keeps the first original: never overwrite it.
            **{
                f"original/{c.path}": c.before
                for c in changes
                if after.files[c.path].original == sha256(c.before)
            },
            **{f"patched/{c.path}": c.after for c in changes},
        },
        tuple(journal.Write(c.path, sha256(c.before), c.after, c.before) for c in changes),
        previous=state,
    )
    return journal.carry_out(record, record.target, change)


def _applied_state(
    state: State,
    release: Version,
    changes: Sequence[FileChange],
    applied: Iterable[str],
    left_out: Collection[str],
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
    ours |= set(applied)
    skipped = (set(state.skipped) if same else set()) | set(left_out)
    return State(str(release), sorted(ours), files, sorted(skipped - ours), state.extra)


class RevertPlan(NamedTuple):
    """What reverting each recorded file takes, judged from its bytes now."""

    state: State  # the committed state the plan was made from
    writes: list[journal.Write]
    untouched: list[str]  # already back to the original bytes
    edited: dict[str, bytes]  # changed since sglpatch patched them: their bytes, kept if forced
    replaced: list[str]  # no longer regular files: never written over, even forced

    @property
    def restored(self) -> tuple[str, ...]:
        """The files the revert writes."""
        return tuple(w.path for w in self.writes)

    @property
    def still_applied(self) -> set[str]:
        """The patches the record keeps after it: those of the files it leaves."""
        return {p for path in self.replaced for p in self.state.files[path].patches}


def plan_revert(record: Record, state: State, force: bool) -> RevertPlan:
    """How to put back the original bytes of every file `state` records. A missing file is
    refused unless `force` (which recreates it); edited and replaced ones are the caller's to
    refuse."""
    plan = RevertPlan(state, [], [], {}, [])
    for path, file in sorted(state.files.items()):
        location = record.locate(path)
        digest = journal.current(location)
        now = _read_or_none(location) if digest else None
        original = record.original(path, file.original)
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


def record_revert(record: Record, plan: RevertPlan) -> str:
    """Carry out `plan` as one journaled change, keeping edited bytes under `files/edited/`;
    the ledger's commit. The files left in place stay recorded, with their patches."""
    state = plan.state
    kept = {path: state.files[path] for path in plan.replaced}
    change = journal.Change(
        "revert",
        _message("revert", record, record.target.release, state.patches),
        State(state.release, sorted(plan.still_applied), kept, extra=state.extra),
        {f"edited/{path}": data for path, data in plan.edited.items()},
        tuple(plan.writes),
        previous=state,
    )
    return journal.carry_out(record, record.target, change)


def _message(
    action: str,
    record: Record,
    release: Version | None,
    patch_ids: list[str],
    skipped: list[str] | None = None,
) -> str:
    """The ledger's commit message: what `sglpatch log` shows of a change."""
    ids = ", ".join(sorted(set(patch_ids))) or "-"
    return (
        f"{action}: {ids} (SGLang {release})\n\n"
        f"target: {record.target.root}\n"
        f"release: {release}\n"
        f"patches: {ids}\n"
        + (f"skipped: {', '.join(skipped)}\n" if skipped else "")
        + f"sglpatch: {__version__}\n"
    )


def _read_or_none(path: Path) -> bytes | None:
    """A regular file's bytes; None if it is missing or not a regular file."""
    try:
        return read_regular(path)
    except (FileNotFoundError, NotRegularFile):
        return None
