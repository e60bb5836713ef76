"""What sglpatch keeps on disk, and how it writes the target safely.

- `ledger`: the store of per-target records (`Ledger(directory)`, `Record`), their locks and the
  confinement of every path they name;
- `state`: what a record says is applied (`State`, `FileRecord`) and its history (`Entry`);
- `git`: the git repository behind each record (reading HEAD, committing);
- `journal`: carrying out a change so that a crash or a failure never splits it;
- `fsio`: reading files without blocking, and replacing them atomically.
"""

from __future__ import annotations

from sglpatch.store.fsio import sha256
from sglpatch.store.ledger import Ledger, Record, default_directory
from sglpatch.store.state import Entry, FileRecord, State

__all__ = ["Entry", "FileRecord", "Ledger", "Record", "State", "default_directory", "sha256"]
