"""One error family. The CLI turns each kind into a one-line message and its exit code."""

from __future__ import annotations

from enum import IntEnum


class ExitCode(IntEnum):
    """Documented process exit codes (README, "Exit codes")."""

    OK = 0
    REFUSED = 1  # declined to protect something: edits, a mismatched or untested release, a lock
    NOT_IN_PLACE = 1  # `status --check`: a patch meant for the release is not in place
    USAGE = 2  # the command line is wrong
    TARGET = 3  # the target is missing, not SGLang, or not in the shape a patch needs
    LEDGER = 4  # the ledger is unusable
    GAPS = 5  # `doctor`: blockers remain (not ready)
    BUG = 70  # an unexpected error in sglpatch itself (EX_SOFTWARE); details in the log
    INTERRUPTED = 130
    BROKEN_PIPE = 141  # 128 + SIGPIPE, as a shell reports a reader that went away


def forget_interrupt() -> None:
    """Let a Ctrl-C already reported end the process with exit 130, not by SIGINT.

    CPython remembers a KeyboardInterrupt that escaped an eval or exec of source text (namedtuple
    and dataclass creation use them, e.g. while libcst imports) and at exit then kills the
    process with SIGINT instead of returning our code. Evaluating any source text clears that.
    """
    eval("None")


class StdoutUnwritable(OSError):
    """Writing the command's output to stdout failed: a full disk, a failing or closed descriptor.

    Not an SglpatchError, and no failure of the command: the CLI's handler exits quietly, 0 when
    its change is on disk already, else 141 as for a reader that went away. The same errno from
    any other write (the ledger's disk filling up) stays a plain OSError.
    """


class SglpatchError(Exception):
    """Base of every error sglpatch expects; `str()` is the one-line message."""

    exit_code: ExitCode = ExitCode.BUG
    # A traceback worth keeping (e.g. from a plugin's code): the CLI writes it to the crash log.
    details: str | None = None

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class UsageError(SglpatchError):
    """An argument is malformed (for example a `--version` that is not a release)."""

    exit_code = ExitCode.USAGE


class RefusedError(SglpatchError):
    """The operation would lose or overwrite something; nothing was changed."""

    exit_code = ExitCode.REFUSED


class TargetError(SglpatchError):
    """The target cannot be found, read or patched; nothing was changed."""

    exit_code = ExitCode.TARGET

    def __init__(self, message: str, path: str | None = None) -> None:
        super().__init__(f"{path}: {message}" if path else message)
        self.path = path


class LedgerError(SglpatchError):
    """The ledger cannot be read or written; nothing was changed."""

    exit_code = ExitCode.LEDGER

    def __init__(self, message: str, directory: str | None = None) -> None:
        super().__init__(f"ledger {directory}: {message}" if directory else message)
        self.directory = directory


class LockedError(RefusedError):
    """Another sglpatch process holds the target; the wait for it timed out."""


class CatalogueError(SglpatchError):
    """A patch module (built-in or a plugin) is malformed or cannot be loaded, or a patch names a
    file outside the target's `sglang` package."""

    exit_code = ExitCode.USAGE


class PatchCrashed(SglpatchError):
    """A plugin patch's own code raised: its fault, not the target's nor sglpatch's. Nothing was
    written; the traceback goes to the crash log."""

    exit_code = ExitCode.TARGET


def interrupted(error: BaseException) -> bool:
    """Whether `error` is a Ctrl-C, or was raised by one: a KeyboardInterrupt among its causes
    and contexts. Python turns one that lands in a class's creation (libcst's, while it imports)
    into a RuntimeError "Error calling __set_name__", which is no failure of that code."""
    seen: set[int] = set()
    waiting: list[BaseException | None] = [error]
    while waiting:
        found = waiting.pop()
        if found is None or id(found) in seen:
            continue
        if isinstance(found, KeyboardInterrupt):
            return True
        seen.add(id(found))
        waiting += [found.__cause__, found.__context__]
    return False


def raised(error: BaseException) -> str:
    """`KeyError: 'x'`, `SystemExit: 0`, or the bare type when the error says nothing."""
    said = text_of(error)
    return type(error).__name__ + (f": {said}" if said else "")


def text_of(value: object) -> str:
    """`str(value)`, which may run a plugin's `__str__`: whatever that raises is not passed on."""
    try:
        return str(value)
    except KeyboardInterrupt:
        raise
    except BaseException:
        return f"<{type(value).__name__} that cannot be shown>"
