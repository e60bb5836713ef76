"""What the resolution compiles of a release's modules, kept between runs (as Python keeps
`__pycache__`): a worker that has not run the release yet spent most of its time parsing and
compiling the same modules again.

Entries are named by the SHA-256 of everything they were computed from (the module's bytes,
its path in the tree, this Python's bytecode magic, the analysis's version), so a changed tree
or another Python never reads a stale one. A missing, unreadable or damaged entry is a miss; an
entry that cannot be written is skipped (a read-only home still runs doctor); every write is a
temporary file renamed into place, so a reader sees an old entry or a new one, never half.
`$SGLPATCH_CACHE_DIR`, else `$XDG_CACHE_HOME/sglpatch`, else `~/.cache/sglpatch`; removing
the folder only makes the next run slower.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import tempfile
from pathlib import Path
from typing import Any

_FOLDER = "compiled"


def folder() -> Path:
    if value := os.environ.get("SGLPATCH_CACHE_DIR"):
        return Path(value).expanduser()
    if value := os.environ.get("XDG_CACHE_HOME"):
        return Path(value).expanduser() / "sglpatch"
    return Path.home() / ".cache" / "sglpatch"


def name(*parts: bytes) -> str:
    """The entry for what `parts` (with this Python's magic) compile to."""
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def load(entry: str) -> object:
    """The value saved as `entry`, or None (never saved, unreadable, damaged)."""
    try:
        value: object = marshal.loads((folder() / _FOLDER / entry).read_bytes())
        return value
    except (OSError, EOFError, ValueError, TypeError):
        return None


def save(entry: str, value: Any) -> None:
    """Keeps `value` (what `marshal` can write) as `entry`; a failure keeps nothing."""
    with contextlib.suppress(OSError, ValueError):
        where = folder() / _FOLDER
        where.mkdir(parents=True, exist_ok=True)
        data = marshal.dumps(value)
        fd, name = tempfile.mkstemp(prefix=f".{entry[:16]}.", dir=where)
        temporary = Path(name)
        try:
            with os.fdopen(fd, "wb") as stream:
                stream.write(data)
            temporary.replace(where / entry)
        except BaseException:
            with contextlib.suppress(OSError):
                temporary.unlink()
            raise
