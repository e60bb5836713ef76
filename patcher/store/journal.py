"""Journaled changes: an apply or revert cut short by a crash is finished by the next run.

A change is carried out in this order: (1) the journal, holding everything the change writes and
the bytes it replaces, is saved beside the ledger; (2) the new target bytes are staged beside their
files; (3) each staged file is renamed over its target (atomic per file), after checking, at the
last moment, that the target still holds the bytes the change was computed from; (4) the ledger
commits; (5) the journal is removed. If a rename or the commit fails, the files already renamed get
their old bytes back and nothing has changed. Killed at any point, every target file is either its
old or its new bytes, and the next apply or revert replays the journal (idempotently) before doing
what it was asked; a journal that cannot be replayed is undone by revert. Ctrl-C (SIGINT) in steps
(1) to (5) is held until the change is complete, then reported: it never splits one. Until a
journal is finished, `effective_state` tells which side of the change each file is on.
"""

from __future__ import annotations

import base64
import contextlib
import json
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sglpatch.errors import LedgerError, RefusedError
from sglpatch.reading import read_regular
from sglpatch.store import fsio
from sglpatch.store.fsio import sha256
from sglpatch.store.ledger import Record
from sglpatch.store.state import State
from sglpatch.target import Target


class Write(NamedTuple):
    """New bytes for one target file (path relative to the target root)."""

    path: str
    before: str | None  # sha256 of the bytes it replaces; None if the file is missing
    after: bytes
    old: bytes | None = None  # the bytes it replaces, to undo it (absent in older journals)


class Change(NamedTuple):
    action: str  # apply or revert
    message: str
    state: State
    ledger_files: Mapping[str, bytes]
    writes: tuple[Write, ...]
    previous: State | None = None  # the committed state before the change (None: unknown)

    def to_json(self) -> bytes:
        data = {
            "action": self.action,
            "message": self.message,
            "state": json.loads(self.state.to_json()),
            "previous": json.loads(self.previous.to_json()) if self.previous else None,
            "ledger_files": {k: _b64(v) for k, v in self.ledger_files.items()},
            "writes": [
                {
                    "path": w.path,
                    "before": w.before,
                    "after": _b64(w.after),
                    **({"old": _b64(w.old)} if w.old is not None else {}),
                }
                for w in self.writes
            ],
        }
        return json.dumps(data).encode()

    @classmethod
    def from_json(cls, raw: bytes) -> Change:
        data: dict[str, Any] = json.loads(raw)
        return cls(
            data["action"],
            data["message"],
            State.from_json(data["state"]),
            {k: base64.b64decode(v) for k, v in data["ledger_files"].items()},
            tuple(_write(w) for w in data["writes"]),
            State.from_json(data["previous"]) if data.get("previous") else None,
        )


def _write(data: Mapping[str, Any]) -> Write:
    path, before = data["path"], data["before"]
    if not isinstance(path, str) or not isinstance(before, (str, type(None))):
        raise TypeError(f"a write names {path!r} with the hash {before!r}")
    old = base64.b64decode(data["old"]) if data.get("old") is not None else None
    return Write(path, before, base64.b64decode(data["after"]), old)


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def journal_path(record: Record) -> Path:
    return record.ledger.directory / "pending" / f"{record.key}.json"


def pending(record: Record) -> str | None:
    """The action of an interrupted change, if one is waiting to be finished."""
    path = journal_path(record)
    if not path.exists():
        return None
    try:
        return str(json.loads(read_regular(path))["action"])
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return "unknown"


def load(record: Record) -> Change | None:
    """The journal of an interrupted change, if one is waiting; raise if it is unreadable."""
    path = journal_path(record)
    if not path.exists():
        return None
    try:
        return Change.from_json(read_regular(path))
    except (OSError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as error:
        raise LedgerError(f"the journal {path} is unreadable ({error})") from None


@contextmanager
def held_interrupts() -> Iterator[None]:
    """Hold SIGINT until the block is done, then raise KeyboardInterrupt as it would have.

    A change cut in two by Ctrl-C would need the journal to repair it; held, it is whole.
    Signals can only be handled in the main thread; elsewhere the block runs as it is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: received.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if received and previous is signal.default_int_handler:
        raise KeyboardInterrupt


def carry_out(record: Record, target: Target, change: Change) -> str:
    """Do `change` as described above; return the ledger commit."""
    path = journal_path(record)
    files = [record.locate(w.path) for w in change.writes]
    with held_interrupts():
        fsio.fault_point("journal", path)
        try:
            fsio.write_atomic(path, change.to_json())
        except OSError as error:
            raise LedgerError(
                f"cannot write the journal: {error.strerror}", str(path.parent)
            ) from None
        try:
            staged = fsio.replace_files(
                [(file, w.after) for file, w in zip(files, change.writes, strict=True)],
                {file: w.before for file, w in zip(files, change.writes, strict=True)},
            )
        except fsio.ReplaceFailed as error:
            if error.undone:
                path.unlink(missing_ok=True)
            raise
        except BaseException:
            path.unlink(missing_ok=True)  # every file has its old bytes: nothing to finish
            raise
        try:
            commit = record.repository.commit(change.message, change.state, change.ledger_files)
        except BaseException:
            # The ledger rolled its work tree back; the files get their old bytes back too.
            if staged.restore():
                path.unlink(missing_ok=True)
            raise
        path.unlink(missing_ok=True)
    return commit


def current(file: Path) -> str | None:
    """sha256 of a target file; None if missing; "" if it is not a regular file (a directory)."""
    try:
        return fsio.digest_of(file)
    except OSError as error:
        raise RefusedError(f"{file}: cannot read: {error.strerror or error}") from None


def effective_state(record: Record, target: Target, change: Change) -> State:
    """What is applied while `change` is unfinished: per file, the side of it the file is on.

    Each file is replaced atomically, so it holds either the bytes it had before the change or
    the bytes the change writes; the record of that side describes it.
    """
    before = change.previous.with_paths(record.local) if change.previous else State()
    after = change.state.with_paths(record.local)
    files = dict(after.files)
    done = 0
    for write in change.writes:
        path = record.local(write.path)
        if current(record.locate(path)) == sha256(write.after):
            done += 1
            continue
        files.pop(path, None)
        if path in before.files:
            files[path] = before.files[path]
    side = after if done or not change.writes else before
    patches = {p for f in files.values() for p in f.patches} | (
        set(before.patches) & set(after.patches)
    )
    return State(side.release, sorted(patches), files, side.skipped, after.extra)


def finish_interrupted(record: Record, target: Target, *, or_undo: bool = False) -> Change | None:
    """Replay a journal left by a killed run; return what it finished, if anything.

    With `or_undo` (revert), a journal that cannot be replayed (a file that can no longer be
    replaced) is undone instead: its files get back the bytes they had before it, and the
    ledger, which commits only after every file is replaced, still holds what it held before.
    """
    change = load(record)
    if change is None:
        return None
    path = journal_path(record)
    todo, stray, expected = [], [], {}
    for write in change.writes:
        file = record.locate(write.path)
        fsio.sweep_stages(file)
        digest = current(file)
        if digest == sha256(write.after):
            continue
        if digest == write.before:
            todo.append((file, write.after))
            expected[file] = write.before
        else:
            stray.append(write.path)
    if stray:
        raise RefusedError(
            f"an interrupted {change.action} left {', '.join(stray)} in a state it did not "
            f"write; check them, then delete {path} to go on"
        )
    with held_interrupts():
        try:
            staged = fsio.replace_files(todo, expected)
        except fsio.ReplaceFailed:
            if not or_undo:
                raise
            _undo(record, change)
            path.unlink(missing_ok=True)
            return None
        state = change.state.with_paths(record.local)
        with contextlib.suppress(OSError):
            record.repository.drop_lock_left_since(path.stat().st_mtime)
        try:
            # a no-op if it got that far
            record.repository.commit(change.message, state, change.ledger_files)
        except BaseException:
            staged.restore()  # the files written now; the journal stays, to finish later
            raise
        path.unlink(missing_ok=True)
    return change


def _undo(record: Record, change: Change) -> None:
    """Give every file the change wrote its old bytes back, from the journal."""
    back, expected = [], {}
    for write in change.writes:
        file = record.locate(write.path)
        if current(file) != sha256(write.after):
            continue  # never written, or undone already
        if write.old is None and write.before is not None:
            raise RefusedError(
                f"an interrupted {change.action} cannot be finished or undone: its journal "
                f"{journal_path(record)} does not hold the old bytes of {write.path}"
            )
        if write.old is None:
            file.unlink(missing_ok=True)
            continue
        back.append((file, write.old))
        expected[file] = sha256(write.after)
    fsio.replace_files(back, expected)
