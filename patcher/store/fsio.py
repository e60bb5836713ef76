"""Replacing files so that each is always either its old or its new bytes, even after a crash."""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from sglpatch.errors import RefusedError, TargetError
from sglpatch.reading import NotRegularFile, read_regular

STAGE_SUFFIX = ".sglpatch"
# Tests set this to fail (or kill the process) at a named step: "stage", "replace",
# "ledger-commit", "journal". Production code never sets it.
fault_hook: Callable[[str, Path], None] | None = None


def fault_point(step: str, path: Path) -> None:
    if fault_hook is not None:
        fault_hook(step, path)


def sha256(data: bytes) -> str:
    import hashlib  # OpenSSL's loader costs a dry run more than it hashes

    return hashlib.sha256(data).hexdigest()


def digest_of(path: Path) -> str | None:
    """sha256 of a file; None if it is missing; "" if it is not a regular file. Raises OSError."""
    try:
        return sha256(read_regular(path))
    except FileNotFoundError:
        return None
    except NotRegularFile:
        return ""


class ChangedWhileRunning(RefusedError):
    """A file no longer holds the bytes a change was computed from: someone else wrote it."""

    def __init__(self, path: Path) -> None:
        super().__init__(
            f"{path} changed while sglpatch was running; nothing was changed, run again"
        )
        self.path = path


class ReplaceFailed(TargetError):
    """A file could not be replaced; `undone` says whether the files replaced before it were put
    back (if not, the journal finishes or undoes the change on the next run)."""

    def __init__(self, message: str, path: Path, undone: bool) -> None:
        super().__init__(message, str(path))
        self.undone = undone


class Staged:
    """New contents written beside their files, ready to be renamed over them."""

    def __init__(self, pairs: list[tuple[Path, Path]]) -> None:
        self._pairs = pairs  # (staged copy, destination)
        self._replaced: list[tuple[Path, bytes | None]] = []  # destinations and their old bytes

    def replace(self, expected: Mapping[Path, str | None] | None = None) -> None:
        """Rename every staged copy over its file, each atomically, or put every file back.

        Before the first rename, every file must be one a rename can replace (see
        `replace_problem`). With `expected` (path -> sha256 of the bytes the change was computed
        from, None for a missing file), each file is checked against it at the last moment
        before its rename: a file someone wrote meanwhile stops the change, and the files already
        replaced get their old bytes back.
        """
        mounts = _mount_points()
        for _, path in self._pairs:
            problem = replace_problem(path, mounts)
            if problem is not None:
                self.discard()
                raise ReplaceFailed(f"{problem}; nothing was changed", path, undone=True)
        for index, (temp, path) in enumerate(self._pairs):
            try:
                fault_point("replace", path)
                old = _old_bytes(path)
                now = sha256(old) if old is not None else None
                if expected is not None and path in expected and now != expected[path]:
                    raise ChangedWhileRunning(path)
                temp.replace(path)
            except BaseException as error:
                Staged(self._pairs[index:]).discard()
                if not self.restore():
                    raise ReplaceFailed(
                        "stopped, and the files replaced before it could not be put back; "
                        "the next run finishes the change",
                        path,
                        undone=False,
                    ) from error
                if isinstance(error, OSError):
                    reason = error.strerror or str(error)
                    raise ReplaceFailed(
                        f"cannot replace: {reason}; nothing was changed", path, undone=True
                    ) from None
                raise
            self._replaced.append((path, old))
            _fsync_dir(path.parent)
            drop_bytecode(path)

    def restore(self) -> bool:
        """Put back the old bytes of every file `replace` replaced; False if one could not be."""
        whole = True
        for path, old in reversed(self._replaced):
            try:
                if old is None:
                    path.unlink(missing_ok=True)
                else:
                    _stage(path, old).replace(path)
                drop_bytecode(path)
            except OSError:
                whole = False
        self._replaced.clear()
        return whole

    def discard(self) -> None:
        for temp, _ in self._pairs:
            temp.unlink(missing_ok=True)


def _old_bytes(path: Path) -> bytes | None:
    try:
        return read_regular(path)
    except FileNotFoundError:
        return None


def replace_problem(path: Path, mounts: frozenset[str]) -> str | None:
    """Why renaming a new file over `path` would fail or do harm; None if it would not.

    A rename changes the file's owner to whoever runs it, so a file owned by someone else is
    refused unless root runs (root keeps the owner). A mount point (a bind-mounted file) or an
    immutable file cannot be renamed over; a read-only one must not be.
    """
    folder = path.parent
    if not os.access(folder, os.W_OK | os.X_OK):
        return "its folder is not writable"
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as error:
        return f"cannot read: {error.strerror}"
    if stat.S_ISLNK(info.st_mode):  # a rename would put a file where the link was
        return "a symbolic link; sglpatch only rewrites regular files"
    if not stat.S_ISREG(info.st_mode):
        return "not a regular file"
    if not os.access(path, os.W_OK):
        mode = stat.S_IMODE(info.st_mode)
        return f"not writable (owned by {_user(info.st_uid)}, mode {mode:04o}; or immutable)"
    if os.geteuid() != 0 and info.st_uid != os.geteuid():
        return (
            f"owned by {_user(info.st_uid)}: replacing it would make it yours; "
            f"run sglpatch as {_user(info.st_uid)}"
        )
    if info.st_dev != folder.stat().st_dev or os.path.realpath(path) in mounts:
        return "a mount point (bind-mounted?): it cannot be replaced in place"
    return None


def _user(uid: int) -> str:
    import pwd

    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _mount_points() -> frozenset[str]:
    """Every mount point this process sees (Linux's /proc/self/mountinfo; empty elsewhere)."""
    try:
        lines = read_regular(Path("/proc/self/mountinfo")).decode(errors="replace").splitlines()
    except OSError:
        return frozenset()
    points = set()
    for line in lines:
        fields = line.split(" ")
        if len(fields) > 4:  # octal escapes: \040 for a space, \011 for a tab...
            points.add(fields[4].encode().decode("unicode_escape", errors="replace"))
    return frozenset(points)


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


def replace_files(
    writes: Sequence[tuple[Path, bytes]], expected: Mapping[Path, str | None] | None = None
) -> Staged:
    """Write every file or none (for a crash in the middle, see the journal)."""
    staged = stage(writes)
    staged.replace(expected)
    return staged


def _stage(path: Path, data: bytes, mode_if_new: int = 0o644) -> Path:
    """A fsynced copy of `data` beside `path`, with its mode and owner; raises OSError."""
    import tempfile  # it imports shutil, random...: only runs that write pay for them

    mode = path.stat().st_mode & 0o7777 if path.exists() else mode_if_new
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


def write_output(path: Path, data: bytes) -> None:
    """Write `data` where the user pointed an output option, as a shell's `>` would, but whole.

    A new file, or a regular file of the writer's own (root: anyone's, keeping its owner), gets
    the bytes by one rename: a failure leaves the old file, and another hard link to it keeps
    the old bytes, so no other name is ever written through. A symbolic link is followed to its
    file. A file `>` could not write (read-only) is refused as `>` refuses it. Anything else is
    written in place, never renamed over: a device (`/dev/null`, `/dev/stdout`), a FIFO that a
    process reads, someone else's file with no other link, or one in a folder that cannot be
    written. A FIFO with no reader, a socket, a folder, and a file with other links that cannot
    be renamed over are refused. Raises OSError.
    """
    try:
        info = path.stat()
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(errno.EISDIR, "is a folder", str(path))
    real = Path(os.path.realpath(path))  # a link's target is what a redirection writes
    regular = info is not None and stat.S_ISREG(info.st_mode)
    if regular and not os.access(path, os.W_OK):
        raise PermissionError(errno.EACCES, "Permission denied", str(path))
    if info is None or (
        regular
        and os.geteuid() in (0, info.st_uid)  # a rename by root keeps the owner; others' not
        and os.access(real.parent, os.W_OK | os.X_OK)
    ):
        temp = _stage(real, data, mode_if_new=0o666 & ~_umask())
        try:
            temp.replace(real)
        except BaseException:
            temp.unlink(missing_ok=True)
            raise
        _fsync_dir(real.parent)
        return
    if regular and info.st_nlink > 1:
        raise OSError(
            errno.EMLINK, "it has other hard links, which a write would change", str(path)
        )
    flags = os.O_WRONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_TRUNC if regular else 0)
    try:
        fd = os.open(path, flags)  # non-blocking: a FIFO with no reader fails at once
    except OSError as error:
        if error.errno == errno.ENXIO:
            what = "a FIFO that no process reads" if stat.S_ISFIFO(info.st_mode) else "a socket"
            raise OSError(errno.ENXIO, what, str(path)) from None
        raise
    try:
        os.set_blocking(fd, True)  # a reader takes the bytes at its own pace
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0o022)  # the only way to read it; put back at once
    os.umask(mask)
    return mask
