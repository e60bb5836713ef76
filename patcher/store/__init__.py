"""What sglpatch keeps on disk, and how it writes the target safely.

- `ledger`: the store of per-target records (`Ledger(directory)`, `Record`), their locks and the
  confinement of every path they name;
- `state`: what a record says is applied (`State`, `FileRecord`) and its history (`Entry`);
- `recording`: what the commands ask of a record (record an apply or a revert, finish an
  interrupted one, read originals back), the one place a change's layout in the ledger is written;
- `git`: the git repository behind each record (reading HEAD, committing);
- `journal`: carrying out a change so that a crash or a failure never splits it;
- `fsio`: reading files without blocking, and replacing them atomically.

What is imported from here is the ledger's public face, all that `sglpatch.api` uses
(tests/test_layers.py checks it); the modules behind it are the store's own.
"""

from __future__ import annotations

from sglpatch.store.fsio import sha256, write_output
from sglpatch.store.journal import current as file_digest
from sglpatch.store.ledger import Ledger, Record, default_directory
from sglpatch.store.recording import (
    RevertPlan,
    finish_interrupted,
    originals_of_patched,
    plan_revert,
    record_apply,
    record_revert,
    state_now,
)
from sglpatch.store.state import Entry, FileRecord, State

__all__ = [
    "Entry",
    "FileRecord",
    "Ledger",
    "Record",
    "RevertPlan",
    "State",
    "default_directory",
    "file_digest",
    "finish_interrupted",
    "originals_of_patched",
    "plan_revert",
    "record_apply",
    "record_revert",
    "sha256",
    "state_now",
    "write_output",
]
