"""Reading a file that may not be one: never wait on a FIFO or a device, never read without bound.

Everything sglpatch reads from a target or a ledger goes through `read_regular`: a FIFO named like
a source file, a link to `/dev/zero` or a socket is refused before it is opened (opening a FIFO
waits for a writer; reading `/dev/zero` never ends), and one swapped in after the check is
opened non-blocking, so it does not wait either.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

# More than any source file SGLang ships; a larger "source file" is not one.
READ_LIMIT = 64 * 1024 * 1024


class NotRegularFile(OSError):
    """A path that should hold a file's bytes is a FIFO, a device, a directory or too large."""


def read_regular(
    path: str | os.PathLike[str],
    limit: int = READ_LIMIT,
    *,
    whole: bool = True,
    follow: bool = True,
) -> bytes:
    """The bytes of a regular file, at most `limit` of them.

    Raises NotRegularFile for anything else, and for a file over `limit` bytes; with
    `whole=False` a larger file gives its first `limit` bytes instead. A symbolic link is followed,
    unless `follow=False` (sglpatch's own files, where a link is damage: it is refused).
    """
    # Plain os calls: the scanner passes strings, cheaper than Paths.
    info = os.stat(path) if follow else os.lstat(path)  # noqa: PTH116
    if stat.S_ISLNK(info.st_mode):
        raise NotRegularFile(errno.ELOOP, "a symbolic link", os.fspath(path))
    if not stat.S_ISREG(info.st_mode):
        raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
    if whole and info.st_size > limit:
        raise NotRegularFile(errno.EFBIG, f"larger than {_size(limit)}", os.fspath(path))
    flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags if follow else flags | os.O_NOFOLLOW)
    except OSError as error:
        if error.errno == errno.ELOOP and not follow:  # a link swapped in after the check
            raise NotRegularFile(errno.ELOOP, "a symbolic link", os.fspath(path)) from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # swapped after the check
            raise NotRegularFile(errno.EINVAL, "not a regular file", os.fspath(path))
        data = os.read(fd, min(info.st_size, limit) + 1)
        while len(data) <= limit and (more := os.read(fd, min(1 << 20, limit + 1 - len(data)))):
            data += more  # it grew meanwhile
    finally:
        os.close(fd)
    if len(data) > limit:
        if whole:
            raise NotRegularFile(errno.EFBIG, f"larger than {_size(limit)}", os.fspath(path))
        data = data[:limit]
    return data


def _size(limit: int) -> str:
    return f"{limit >> 20} MB" if limit >= 1 << 20 else f"{limit} bytes"


def files_under(
    folder: Path, suffix: str, *, deep: bool = True, skip: frozenset[str] = frozenset()
) -> tuple[list[Path], list[tuple[Path, OSError]]]:
    """The files in `folder` named `*suffix` (`deep`: and in its subfolders but those named in
    `skip`, links to folders not followed, as `Path.rglob`), sorted; and each folder that exists
    but cannot be listed, with its error, where `Path.glob` and `rglob` pass it over in silence.
    A missing folder holds none."""
    found: list[Path] = []
    unlisted: list[tuple[Path, OSError]] = []
    folders = [folder]
    while folders:
        current = folders.pop()
        try:
            with os.scandir(current) as listing:
                entries = list(listing)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError as error:
            unlisted.append((current, error))
            continue
        for entry in entries:
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:  # no type in the listing, and no right to look: read as a file
                is_folder = False
            if is_folder:
                if deep and entry.name not in skip:
                    folders.append(Path(entry.path))
            elif entry.name.endswith(suffix):
                found.append(Path(entry.path))
    return sorted(found), unlisted
