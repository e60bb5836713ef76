"""Replacing files so that each is always either its old or its new bytes, even after a crash."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from sglpatch.errors import TargetError

# Tests set this to fail at a chosen step ("stage", "replace") and prove nothing is half-done.
fault_hook: Callable[[str, Path], None] | None = None


def _fault(step: str, path: Path) -> None:
    if fault_hook is not None:
        fault_hook(step, path)


def replace_files(writes: Sequence[tuple[Path, bytes]]) -> None:
    """Write every file or none.

    First every new content is staged beside its file (same directory, same mode, fsynced), so a
    full disk or a read-only folder fails before any file changes. Then each stage is renamed
    over its file, which is atomic, and stale bytecode is dropped.
    """
    staged: list[tuple[Path, Path]] = []
    try:
        for path, data in writes:
            _fault("stage", path)
            try:
                staged.append((_stage(path, data), path))
            except OSError as error:
                raise TargetError(f"cannot write: {error.strerror}", str(path)) from None
    except BaseException:
        for temp, _ in staged:
            temp.unlink(missing_ok=True)
        raise
    for index, (temp, path) in enumerate(staged):
        try:
            _fault("replace", path)
            temp.replace(path)
        except BaseException:
            for later, _ in staged[index:]:
                later.unlink(missing_ok=True)
            raise
        _fsync_dir(path.parent)
        drop_bytecode(path)


def _stage(path: Path, data: bytes) -> Path:
    """A fsynced copy of `data` beside `path`, with its mode and owner; raises OSError."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".sglpatch", dir=path.parent)
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        temp.chmod(mode)
        if path.exists():
            stat = path.stat()
            with contextlib.suppress(OSError):  # only root can give a file away
                os.chown(temp, stat.st_uid, stat.st_gid)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def _fsync_dir(directory: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def drop_bytecode(path: Path) -> None:
    """Remove `__pycache__/<stem>.*.pyc` for every interpreter, not only this one."""
    cache = path.parent / "__pycache__"
    if cache.is_dir():
        for pyc in cache.glob(f"{path.stem}.*.pyc"):
            pyc.unlink(missing_ok=True)


def write_atomic(path: Path, data: bytes) -> None:
    """One file, for sglpatch's own state (the ledger's records and journal)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = _stage(path, data)
    temp.replace(path)
    _fsync_dir(path.parent)
