"""What the resolution compiles of a release's modules, kept between runs (as Python keeps
`__pycache__`): a worker that has not run the release yet spent most of its time parsing and
compiling the same modules again.

Entries are named by the SHA-256 of everything they were computed from (the module's bytes,
its path in the tree, this Python's bytecode magic, the source of the code that computed them),
so a changed tree, another Python or another sglpatch never reads a stale one. Each starts with
the SHA-256 of the rest. A missing, unreadable or damaged entry is a miss, and so is every entry
of a folder another user owns or may write (entries are code that runs); an entry that cannot be
written is skipped (a read-only home still runs doctor); every write is a temporary file renamed
into place, so a reader sees an old entry or a new one, never half.
`$SGLPATCH_CACHE_DIR`, else `$XDG_CACHE_HOME/sglpatch`, else `~/.cache/sglpatch`; removing
the folder only makes the next run slower.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.util
import marshal
import os
import stat
import tempfile
from pathlib import Path
from typing import Any

_FOLDER = "compiled"


def folder() -> Path | None:
    """Where entries are kept; None when there is no home to keep them in."""
    try:
        if value := os.environ.get("SGLPATCH_CACHE_DIR"):
            return Path(value).expanduser()
        if value := os.environ.get("XDG_CACHE_HOME"):
            return Path(value).expanduser() / "sglpatch"
        return Path.home() / ".cache" / "sglpatch"
    except RuntimeError:  # no HOME and no passwd entry
        return None


def _own(where: Path) -> bool:
    """Entries are code that runs: only a folder this user owns and no one else may write."""
    try:
        found = where.stat()
    except OSError:
        return False
    mine = not hasattr(os, "getuid") or found.st_uid == os.getuid()
    return mine and not found.st_mode & (stat.S_IWGRP | stat.S_IWOTH)


def name(*parts: bytes) -> str:
    """The entry for what `parts` (with this Python's magic) compile to."""
    digest = hashlib.sha256(importlib.util.MAGIC_NUMBER)
    for part in parts:
        digest.update(len(part).to_bytes(8, "little"))
        digest.update(part)
    return digest.hexdigest()


def load(entry: str) -> object:
    """The value saved as `entry`, or None (never saved, unreadable, damaged, or in a folder
    another user could have written)."""
    base = folder()
    if base is None or not _own(base / _FOLDER):
        return None
    try:
        data = (base / _FOLDER / entry).read_bytes()
        digest, payload = data[:32], data[32:]
        if hashlib.sha256(payload).digest() != digest:
            return None
        value: object = marshal.loads(payload)
        return value
    except (OSError, EOFError, ValueError, TypeError):
        return None


def save(entry: str, value: Any) -> None:
    """Keeps `value` (what `marshal` can write) as `entry`; a failure keeps nothing."""
    base = folder()
    if base is None:
        return
    with contextlib.suppress(OSError, ValueError):
        where = base / _FOLDER
        where.mkdir(mode=0o700, parents=True, exist_ok=True)
        if not _own(where):
            return
        payload = marshal.dumps(value)
        data = hashlib.sha256(payload).digest() + payload
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
