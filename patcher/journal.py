"""Journaled changes: an apply or revert cut short by a crash is finished by the next run.

A change is carried out in this order: (1) the journal, holding everything the change writes, is
saved beside the ledger; (2) the new target bytes are staged beside their files; (3) the ledger
commits; (4) each staged file is renamed over its target (atomic per file); (5) the journal is
removed. Killed at any point, every target file is either its old or its new bytes, and the next
apply or revert replays the journal (idempotently) before doing what it was asked. Ctrl-C (SIGINT)
in steps (1) to (5) is held until the change is complete, then reported: it never splits one.
Until a journal is finished, `effective_state` tells which side of the change each file is on.
"""

from __future__ import annotations

import base64
import json
import signal
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NamedTuple

from sglpatch import fsio
from sglpatch.errors import LedgerError, RefusedError
from sglpatch.ledger import Record, State, sha256
from sglpatch.target import Target


class Write(NamedTuple):
    """New bytes for one target file (path relative to the target root)."""

    path: str
    before: str | None  # sha256 of the bytes it replaces; None if the file is missing
    after: bytes


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
                {"path": w.path, "before": w.before, "after": _b64(w.after)} for w in self.writes
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
            tuple(
                Write(w["path"], w["before"], base64.b64decode(w["after"])) for w in data["writes"]
            ),
            State.from_json(data["previous"]) if data.get("previous") else None,
        )


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
        return str(json.loads(path.read_bytes())["action"])
    except (OSError, ValueError, KeyError):
        return "unknown"


def load(record: Record) -> Change | None:
    """The journal of an interrupted change, if one is waiting; raise if it is unreadable."""
    path = journal_path(record)
    if not path.exists():
        return None
    try:
        return Change.from_json(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError) as error:
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
    with held_interrupts():
        fsio.fault_point("journal", path)
        try:
            fsio.write_atomic(path, change.to_json())
        except OSError as error:
            raise LedgerError(
                f"cannot write the journal: {error.strerror}", str(path.parent)
            ) from None
        try:
            staged = fsio.stage([(target.root / w.path, w.after) for w in change.writes])
        except BaseException:
            path.unlink(missing_ok=True)
            raise
        try:
            commit = record.commit(change.message, change.state, change.ledger_files)
        except BaseException:
            # The ledger rolled its work tree back: nothing changed, nothing to finish.
            staged.discard()
            path.unlink(missing_ok=True)
            raise
        staged.replace()
        path.unlink(missing_ok=True)
    return commit


def current(file: Path) -> str | None:
    """sha256 of a target file; None if missing; "" if it is not a regular file (a directory)."""
    try:
        return sha256(file.read_bytes())
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        return ""
    except OSError as error:
        raise RefusedError(f"{file}: cannot read: {error.strerror}") from None


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
        if current(target.root / path) == sha256(write.after):
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


def finish_interrupted(record: Record, target: Target) -> Change | None:
    """Replay a journal left by a killed run; return what it finished, if anything."""
    change = load(record)
    if change is None:
        return None
    path = journal_path(record)
    todo, stray = [], []
    for write in change.writes:
        file = target.root / record.local(write.path)
        fsio.sweep_stages(file)
        digest = current(file)
        if digest == sha256(write.after):
            continue
        if digest == write.before:
            todo.append((file, write.after))
        else:
            stray.append(write.path)
    if stray:
        raise RefusedError(
            f"an interrupted {change.action} left {', '.join(stray)} in a state it did not "
            f"write; check them, then delete {path} to go on"
        )
    with held_interrupts():
        state = change.state.with_paths(record.local)
        record.commit(change.message, state, change.ledger_files)  # a no-op if it got that far
        fsio.replace_files(todo)
        path.unlink(missing_ok=True)
    return change
