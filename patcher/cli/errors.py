"""The one handler that turns what a command raised into one line on stderr and an exit code."""

from __future__ import annotations

import errno
import functools
import os
import re
import stat
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn, TextIO, TypeVar

import typer

from sglpatch import __version__
from sglpatch.errors import (
    ExitCode,
    SglpatchError,
    StdoutUnwritable,
    UsageError,
    forget_interrupt,
    interrupted,
    raised,
)
from sglpatch.reading import NotRegularFile

F = TypeVar("F", bound=Callable[..., None])


def handled(command: F) -> F:
    """Turn sglpatch's errors into one line on stderr and their exit code; never a traceback."""

    @functools.wraps(command)
    def wrapper(*args: object, **kwargs: object) -> None:
        ledger = kwargs.get("ledger")
        ledger = ledger if isinstance(ledger, Path) else None
        if sys.stdout is None:  # started with stdout closed: what it would say goes nowhere
            sys.stdout = Path(os.devnull).open("w")  # noqa: SIM115 - lives as long as the process
        changed.clear()
        guarded = _GuardedOutput(sys.stdout)
        sys.stdout = guarded
        try:
            _refuse_undecodable(command, kwargs)
            command(*args, **kwargs)
        except SglpatchError as error:
            message = error.message
            if error.details:  # e.g. a plugin's traceback: kept, not shown
                message += f" (details in {write_crash_log(ledger, error.details)})"
            say_error(message)
            # an error never exits 0, whatever a subclass (a plugin's own?) declares
            raise typer.Exit(error.exit_code or ExitCode.BUG) from None
        except KeyboardInterrupt:
            exit_interrupted()
        except typer.Exit:
            raise
        except BaseException as error:  # SystemExit too: no command ends by sys.exit
            if interrupted(error):  # e.g. Ctrl-C in the middle of importing libcst
                exit_interrupted()
            if isinstance(error, BrokenPipeError) and _stdout_closed():
                # `sglpatch ... | head`: the reader left; say nothing more
                os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
                raise typer.Exit(ExitCode.OK if changed else ExitCode.BROKEN_PIPE) from None
            if isinstance(error, StdoutUnwritable):  # full or failing: what was done is done
                raise typer.Exit(ExitCode.OK if changed else ExitCode.BROKEN_PIPE) from None
            # a bug in sglpatch (a BrokenPipeError from a pipe to git, too): keep the details,
            # show one line
            log = write_crash_log(ledger)
            say_error(f"internal error: {raised(error)} (details in {log})")
            raise typer.Exit(ExitCode.BUG) from None
        finally:
            if sys.stdout is guarded:
                sys.stdout = guarded.stream

    return wrapper  # type: ignore[return-value]


def exit_interrupted() -> NoReturn:
    """End the command as interrupted: exit 130, whose one line `Group.main` prints."""
    forget_interrupt()
    raise typer.Exit(ExitCode.INTERRUPTED) from None


def keep_unraisable_interrupts() -> list[bool]:
    """From now on in this process, a Ctrl-C that Python can only report is kept, not shown.

    A KeyboardInterrupt that lands in code whose errors Python cannot pass on (an at-fork
    callback, a `__del__`, a weakref callback) is printed as "Exception ignored in ..." with its
    traceback, and the command runs on as if no Ctrl-C had come. The list returned holds True
    once that happened: the process then ends as interrupted all the same.
    """
    kept: list[bool] = []
    shown = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if isinstance(unraisable.exc_value, KeyboardInterrupt):
            kept.append(True)
        else:
            shown(unraisable)

    sys.unraisablehook = hook
    return kept


# Set by a command once its change is on disk: output that fails after that is no failure.
changed: list[bool] = []


def _stdout_closed() -> bool:
    """Whether stdout's reader went away: fd 1 polls as an error (a pipe) or a hang-up (a socket).

    A BrokenPipeError can come from any pipe (one to git); only a closed stdout means 141.
    """
    import select

    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a test's buffer): cannot close
        return False
    if not hasattr(select, "poll"):  # no poll (Windows): what a broken pipe meant before
        return True
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return True
    gone = select.POLLERR | select.POLLHUP | select.POLLNVAL
    return any(mask & gone for _, mask in events)


def _refuse_undecodable(command: Callable[..., None], given: dict[str, object]) -> None:
    """An option's text holding bytes that are not UTF-8 is a usage error, naming the option.

    Python keeps such bytes of the command line as lone surrogates, which no later step (a
    search of the source, a message) can encode. Paths (`Path` values and `--output`) are left
    alone: a file name needs no encoding.
    """
    for name, value in given.items():
        if name in _PATH_TEXT:
            continue
        for text in value if isinstance(value, list) else [value]:
            if isinstance(text, str) and _SURROGATES.search(text):
                shown = text.encode("utf-8", "surrogateescape").decode("ascii", "backslashreplace")
                raise UsageError(f"{_flag(command, name)} '{shown}' is not UTF-8 text")


_PATH_TEXT = ("output",)  # a str option naming a file


_SURROGATES = re.compile("[\udc80-\udcff]")


def _flag(command: Callable[..., None], name: str) -> str:
    """The option (e.g. `--only`) that fills the parameter `name` of `command`."""
    import typing

    try:
        hint = typing.get_type_hints(command, include_extras=True)[name]
    except Exception:  # an annotation that does not resolve: the usual spelling
        hint = None
    for extra in getattr(hint, "__metadata__", ()):
        # typer.Option("--only", ...) keeps the first name as its default in an Annotated hint
        names = [getattr(extra, "default", None), *(getattr(extra, "param_decls", None) or ())]
        declared = [n for n in names if isinstance(n, str) and n.startswith("--")]
        if declared:
            return declared[0]
    return "--" + name.replace("_", "-")


class _GuardedOutput:
    """sys.stdout while a command runs.

    A write or flush failing with the errno of an output that takes no more (a full disk, a
    failing or closed descriptor) raises StdoutUnwritable, which the handler tells from the same
    errno out of any other write (the ledger's). The rest is the stream's own; its binary
    `buffer` (where click writes bytes, and text when the stream's encoding is ASCII) is guarded
    too.
    """

    def __init__(self, stream: Any) -> None:
        self.stream = stream

    def write(self, data: Any) -> Any:
        return _typed(self.stream.write, data)

    def flush(self) -> None:
        _typed(self.stream.flush)

    @property
    def buffer(self) -> _GuardedOutput:
        return _GuardedOutput(self.stream.buffer)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.stream, name)


def _typed(method: Callable[..., Any], *args: Any) -> Any:
    """`method(*args)`, with an OSError of an output that takes no more as StdoutUnwritable."""
    try:
        return method(*args)
    except OSError as error:
        if error.errno in _OUTPUT_ERRNOS:
            raise StdoutUnwritable(error.errno, error.strerror) from error
        raise


_OUTPUT_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF)


def say_error(message: str) -> None:
    typer.echo(f"sglpatch: error: {_printable(message)}", err=True)


def _printable(text: str) -> str:
    """`text` with the bytes Python could not decode (lone surrogates) shown as `\\xff`."""
    try:
        raw = text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:  # a surrogate no byte stands for
        return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return raw.decode("utf-8", "backslashreplace")


def write_crash_log(ledger: Path | None, details: str | None = None) -> str:
    """Append the traceback to `sglpatch-crash.log` in the ledger in use (--ledger or default).

    Never raises: it runs while an error is being reported, which must stay one line.
    """
    import traceback

    try:
        text = details or traceback.format_exc()
    except Exception:
        text = "(the traceback could not be formatted)"
    for folder in _crash_log_folders(ledger):
        path = folder / "sglpatch-crash.log"
        try:
            folder.mkdir(parents=True, exist_ok=True)
            # argv holds undecodable bytes as lone surrogates, a traceback may too
            with _open_log(path) as handle:
                handle.write(f"sglpatch {__version__}: {' '.join(sys.argv)}\n{text}\n")
            return str(path)
        except Exception:  # unwritable, not a folder, a path the system refuses: the next one
            continue
    return "nowhere: no writable folder"


def _open_log(path: Path) -> TextIO:
    """`path` opened to append, if it is a regular file (or none yet).

    A FIFO there (the log falls back to the shared TMPDIR) would make the open wait for a
    reader, and a symbolic link would append to whatever it names: both are refused.
    """
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK
    fd = os.open(path, flags | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0), 0o600)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise NotRegularFile(errno.EINVAL, "not a regular file", str(path))
    return open(fd, "a", encoding="utf-8", errors="backslashreplace")  # noqa: PTH123


def _crash_log_folders(ledger: Path | None) -> list[Path]:
    folders = []
    try:
        from sglpatch.store import default_directory

        folders.append(ledger.absolute() if ledger else default_directory())
    except Exception:  # e.g. no home folder to find the default ledger in
        pass
    folders.append(Path(os.environ.get("TMPDIR") or "/tmp"))
    return folders
