"""Journaled changes: an apply or revert cut short by a crash is finished by the next run.

A change is carried out in this order: (1) the journal, holding everything the change writes, is
saved beside the ledger; (2) the new target bytes are staged beside their files; (3) the ledger
commits; (4) each staged file is renamed over its target (atomic per file); (5) the journal is
removed. Killed at any point, every target file is either its old or its new bytes, and the next
apply or revert replays the journal (idempotently) before doing what it was asked.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
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

    def to_json(self) -> bytes:
        data = {
            "action": self.action,
            "message": self.message,
            "state": json.loads(self.state.to_json()),
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


def carry_out(record: Record, target: Target, change: Change) -> str:
    """Do `change` as described above; return the ledger commit."""
    path = journal_path(record)
    fsio.fault_point("journal", path)
    try:
        fsio.write_atomic(path, change.to_json())
    except OSError as error:
        raise LedgerError(f"cannot write the journal: {error.strerror}", str(path.parent)) from None
    try:
        staged = fsio.stage([(target.root / w.path, w.after) for w in change.writes])
    except BaseException:
        path.unlink(missing_ok=True)
        raise
    try:
        commit = record.commit(change.message, change.state, change.ledger_files)
    except BaseException:
        staged.discard()
        path.unlink(missing_ok=True)
        raise
    staged.replace()
    path.unlink(missing_ok=True)
    return commit


def finish_interrupted(record: Record, target: Target) -> Change | None:
    """Replay a journal left by a killed run; return what it finished, if anything."""
    path = journal_path(record)
    if not path.exists():
        return None
    try:
        change = Change.from_json(path.read_bytes())
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise LedgerError(f"the journal {path} is unreadable ({error})") from None
    todo, stray = [], []
    for write in change.writes:
        file = target.root / write.path
        fsio.sweep_stages(file)
        current = file.read_bytes() if file.exists() else None
        digest = sha256(current) if current is not None else None
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
    record.commit(change.message, change.state, change.ledger_files)  # no-op if it got that far
    fsio.replace_files(todo)
    path.unlink(missing_ok=True)
    return change
