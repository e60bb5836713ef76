"""Replacing files so that each is always either its old or its new bytes, even after a crash."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from sglpatch.errors import TargetError

STAGE_SUFFIX = ".sglpatch"

# Tests set this to fail (or kill the process) at a named step: "stage", "replace",
# "ledger-commit", "journal". Production code never sets it.
fault_hook: Callable[[str, Path], None] | None = None


def fault_point(step: str, path: Path) -> None:
    if fault_hook is not None:
        fault_hook(step, path)


class Staged:
    """New contents written beside their files, ready to be renamed over them."""

    def __init__(self, pairs: list[tuple[Path, Path]]) -> None:
        self._pairs = pairs  # (staged copy, destination)

    def replace(self) -> None:
        """Rename every staged copy over its file: each rename is atomic."""
        for index, (temp, path) in enumerate(self._pairs):
            try:
                fault_point("replace", path)
                temp.replace(path)
            except BaseException:
                Staged(self._pairs[index:]).discard()
                raise
            _fsync_dir(path.parent)
            drop_bytecode(path)

    def discard(self) -> None:
        for temp, _ in self._pairs:
            temp.unlink(missing_ok=True)


def stage(writes: Sequence[tuple[Path, bytes]]) -> Staged:
    """Write every new content beside its file (same mode and owner, fsynced), or none.

    A full disk or a read-only folder fails here, before any file changes.
    """
    pairs: list[tuple[Path, Path]] = []
    try:
        for path, data in writes:
            try:
                fault_point("stage", path)
                pairs.append((_stage(path, data), path))
            except OSError as error:
                raise TargetError(f"cannot write: {error.strerror}", str(path)) from None
    except BaseException:
        Staged(pairs).discard()
        raise
    return Staged(pairs)


def replace_files(writes: Sequence[tuple[Path, bytes]]) -> None:
    """Write every file or none (for a crash in the middle, see the journal)."""
    stage(writes).replace()


def _stage(path: Path, data: bytes) -> Path:
    """A fsynced copy of `data` beside `path`, with its mode and owner; raises OSError."""
    import tempfile  # it imports shutil, random...: only runs that write pay for them

    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    fd, name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=STAGE_SUFFIX, dir=path.parent)
    temp = Path(name)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        if path.exists():
            stat = path.stat()
            with contextlib.suppress(OSError):  # only root can give a file away
                os.chown(temp, stat.st_uid, stat.st_gid)
        temp.chmod(mode)  # after chown, which clears the setuid and setgid bits
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def sweep_stages(path: Path) -> None:
    """Remove staged copies of `path` that a killed run left behind."""
    for leftover in path.parent.glob(f".{path.name}.*{STAGE_SUFFIX}"):
        leftover.unlink(missing_ok=True)


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
