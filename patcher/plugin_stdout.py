"""While a plugin's code runs, what it writes to stdout goes to stderr: file descriptor 1 too.

`--json` promises one JSON object on stdout. `redirect_stdout` catches a plugin's `print()`, but
`os.write(1, ...)`, a C extension's `printf` and a subprocess that inherits stdout write to file
descriptor 1 itself. So, around a plugin's import and each call of its code, descriptor 1 is
pointed at stderr's file and then back at stdout's, which it saved; sglpatch's own output (the
JSON object) is written when no plugin code runs, to stdout itself.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
from collections.abc import Iterator
from typing import Any

_lock = threading.Lock()
_depth = 0  # plugin code running now (a guarded call inside another moves nothing)
_saved: int | None = None  # stdout's descriptor while fd 1 points at stderr
_stdout_was_open = sys.__stdout__ is not None  # else fd 1 may be any file opened since
_stderr_was_open = sys.__stderr__ is not None


@contextlib.contextmanager
def to_stderr() -> Iterator[None]:
    """Run a plugin's code with stdout, the Python stream and descriptor 1, going to stderr."""
    _point_at_stderr()
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        _point_back()


def _point_at_stderr() -> None:
    global _depth, _saved
    with _lock:
        _depth += 1
        if _depth > 1 or not _stdout_was_open:
            return
        with contextlib.suppress(Exception):  # a stream that cannot flush says so itself later
            if sys.stdout is not None:
                sys.stdout.flush()  # sglpatch's own output so far, to stdout still
        try:
            saved = os.dup(1)
        except OSError:  # closed since: nothing of ours goes there
            return
        try:
            if _stderr_was_open:
                os.dup2(2, 1)
            else:  # started with stderr closed: what it says goes nowhere, as stderr's would
                _to_devnull(1)
        except OSError:
            os.close(saved)
            return
        _saved = saved


def _point_back() -> None:
    global _depth, _saved
    with _lock:
        _depth -= 1
        if _depth > 0 or _saved is None:
            return
        with contextlib.suppress(Exception):
            if sys.stderr is not None:
                sys.stderr.flush()
        _flush_c_stdio()
        saved, _saved = _saved, None
        os.dup2(saved, 1)
        os.close(saved)


def _to_devnull(fd: int) -> None:
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _flush_c_stdio() -> None:
    """What a C extension's printf left in the C library's buffer goes out now, to stderr, not
    at exit to stdout after the JSON."""
    if not _fflush:
        with contextlib.suppress(Exception):  # no C library to ask (Windows)
            import ctypes

            _fflush.append(ctypes.CDLL(None).fflush)
        if not _fflush:
            _fflush.append(None)
    if _fflush[0] is not None:
        with contextlib.suppress(Exception):
            _fflush[0](None)


_fflush: list[Any] = []  # the C library's fflush, found on the first plugin call
