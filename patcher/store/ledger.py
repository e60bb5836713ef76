"""The ledger: what sglpatch changed in each target, as git repositories that sglpatch owns.

`Ledger(directory)` is a store like pre-commit's: a README, one git repository per target under
`targets/` (keyed by the target's resolved `sglang` package folder, not by its release, which
changes on upgrade) and a lock per target under `locks/`. Each repository's work tree holds
`state.json` (what is applied now) and `files/original/...`, `files/patched/...`,
`files/edited/...`; every apply and revert is a commit. `.git/sglpatch-committed-state` holds the
hash of the state HEAD holds, so a work tree a failed commit left behind is never believed.
Reads (`state`, `stored`) are plain file reads; only writes and `history` load gitpython.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import math
import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sglpatch.errors import LedgerError, LockedError, RefusedError, UsageError
from sglpatch.patch import path_problem
from sglpatch.reading import read_regular
from sglpatch.store.fsio import sha256, write_atomic
from sglpatch.store.git import Repository, confined
from sglpatch.store.state import Entry, State
from sglpatch.target import Target, symlink_on_the_way

# Another ledger's files are hints: read them without waiting on them, and never much of them.
HINT_LIMIT = 16 * 1024 * 1024

README = """\
# sglpatch ledger

This directory belongs to sglpatch. It records every change sglpatch made to an SGLang
installation, so that `sglpatch revert` can put every byte back.

- `targets/<name>/` is a git repository per patched SGLang tree. `state.json` says what is applied
  now; `files/original/` and `files/patched/` hold the bytes before and after; `git log` there is
  the history (`sglpatch log` shows it).
- `locks/` holds the lock files that keep two sglpatch runs off the same target.

Deleting a target's folder makes sglpatch forget its patches: revert them first.
"""


def default_directory() -> Path:
    """`$SGLPATCH_LEDGER`, else `$XDG_STATE_HOME/sglpatch`, else `~/.local/state/sglpatch`.

    Always absolute: a relative `$XDG_STATE_HOME` is invalid by the XDG spec and ignored, and a
    relative `$SGLPATCH_LEDGER` is resolved once here, so no later step depends on the cwd.
    """
    if os.environ.get("SGLPATCH_LEDGER"):
        return Path(os.environ["SGLPATCH_LEDGER"]).expanduser().absolute()
    state_home = os.environ.get("XDG_STATE_HOME", "")
    if not Path(state_home).is_absolute():
        state_home = str(Path.home() / ".local" / "state")
    return Path(state_home).absolute() / "sglpatch"


class Ledger:
    """The store of per-target ledgers in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.expanduser().absolute()

    def record(self, target: Target) -> Record:
        """The record of `target`, keyed by its resolved `sglang` package folder.

        However the target is spelled (site-packages, the package, a checkout or its `python/`,
        through a symlink), the same package has the same record.
        """
        package = target.package_dir.resolve()
        root = target.root.resolve()
        if self.directory.resolve().is_relative_to(root):
            raise RefusedError(
                f"the ledger {self.directory} is inside the target {root}; choose another --ledger"
            )
        key = _key(package)
        legacy = _key(root)  # older ledgers keyed records by the target root as spelled
        if (
            not (self.directory / "targets" / key).exists()
            and (self.directory / "targets" / legacy / "state.json").is_file()
        ):
            key = legacy
        return Record(self, key, target)

    def foreign(self, record: Record) -> dict[str, tuple[Path, str]]:
        """Files of `record`'s target holding bytes that another record says it wrote.

        Maps each such path (as the target spells it) to that record's folder and target. Looks
        in this ledger and in every other ledger this user's sglpatch has created, so a moved
        tree, a path spelled another way or another `--ledger` is never taken for "not applied".
        """
        found: dict[str, tuple[Path, str]] = {}
        digests: dict[str, str | None] = {}
        for ledger in dict.fromkeys((self.directory, default_directory(), *known_ledgers())):
            for state_file in sorted((ledger / "targets").glob("*/state.json")):
                folder = state_file.parent
                if folder == record.directory:
                    continue
                try:
                    files = json.loads(read_regular(state_file, HINT_LIMIT)).get("files", {})
                    owner = json.loads(read_regular(folder / "target.json", HINT_LIMIT))["target"]
                    recorded = [(record.local(str(p)), f["patched"]) for p, f in files.items()]
                except (OSError, ValueError, TypeError, AttributeError, KeyError, RecursionError):
                    continue
                for path, patched in recorded:
                    if path not in digests:
                        digests[path] = _digest_or_none(record.target.root, path)
                    if digests[path] == patched:
                        found.setdefault(path, (folder, str(owner)))
        return found


def _digest_or_none(root: Path, path: str) -> str | None:
    try:
        return sha256(read_regular(root / confined(path)))
    except (OSError, LedgerError):
        return None


def _key(package: Path) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(package)).strip("-")[-60:]
    return f"{slug}-{sha256(str(package).encode())[:12]}"


def lock_timeout() -> float:
    """Seconds to wait for another run's lock: `$SGLPATCH_LOCK_TIMEOUT`, 10 by default."""
    text = os.environ.get("SGLPATCH_LOCK_TIMEOUT") or "10"  # empty is unset, as for PATH
    try:
        seconds = float(text)
    except ValueError:
        seconds = math.nan
    if not math.isfinite(seconds) or seconds < 0:
        raise UsageError(
            f"SGLPATCH_LOCK_TIMEOUT must be a number of seconds (0 or more), not {text!r}"
        )
    return seconds


KNOWN_LEDGERS = "known-ledgers"


def known_ledgers() -> list[Path]:
    """Ledgers besides the default one that sglpatch created (listed in the default one).

    A JSON list of paths, so that any path (one holding a newline) survives; older sglpatch
    wrote one path a line, which is still read.
    """
    path = default_directory() / KNOWN_LEDGERS
    try:
        raw = read_regular(path, HINT_LIMIT)
    except OSError:
        return []
    text = raw.decode("utf-8", errors="surrogateescape")
    try:
        listed = json.loads(text)
    except ValueError:
        return [Path(line) for line in text.splitlines() if line.strip()]
    except RecursionError:  # `[[[[…` nested past the parser's stack: no list sglpatch wrote
        raise LedgerError(
            f"{KNOWN_LEDGERS} is damaged (nested too deep to read); remove it", str(path.parent)
        ) from None
    if not isinstance(listed, list):
        return []
    return [Path(item) for item in listed if isinstance(item, str) and item]


def _register(directory: Path) -> None:
    """Note a non-default ledger in the default one, so `status` elsewhere can find its records."""
    home = default_directory()
    known = known_ledgers()
    if directory == home or directory in known:
        return
    listed = [str(path) for path in (*known, directory)]
    data = json.dumps(listed, ensure_ascii=True, indent=1).encode("ascii", "surrogateescape")
    with contextlib.suppress(OSError, UnicodeError):  # a hint for status, never a failure
        write_atomic(home / KNOWN_LEDGERS, data + b"\n")


def _other_spelling(path: str) -> str:
    """`sglang/x` as a checkout spells it (`python/sglang/x`), and back."""
    if path.startswith("python/sglang/"):
        return path.removeprefix("python/")
    return f"python/{path}"


class Record:
    """The ledger of one target: its state, its history and its lock."""

    def __init__(self, ledger: Ledger, key: str, target: Target) -> None:
        self.ledger = ledger
        self.key = key
        self.target = target
        self.directory = ledger.directory / "targets" / key
        # Its git repository: HEAD is the truth of what is applied; every change is a commit.
        self.repository = Repository(
            self.directory,
            ledger.directory / "pending" / f"{key}.json",
            target.root,
            self._init_store,
        )

    def exists(self) -> bool:
        return (self.directory / "state.json").is_file()

    def state(self) -> State:
        """The committed state, with file paths as this target spells them."""
        data = self.repository.committed_state_bytes()
        if data is None:
            return State()
        try:
            parsed = json.loads(data)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
            state = State.from_json(parsed)
        except (ValueError, TypeError, AttributeError, KeyError, RecursionError) as error:
            raise LedgerError(f"state.json is unreadable ({error})", str(self.directory)) from None
        return state.with_paths(self.local)

    def locate(self, path: str) -> Path:
        """The target file a recorded path names: inside the target's package, or refused.

        Paths in the ledger (state, journal) are confined as a patch's own paths are: relative,
        no `..`, under the package, no symbolic link to a folder on the way.
        """
        local = self.local(path)
        prefix = self.target.relative("")
        package_path = local.removeprefix(prefix)
        problem = "is not under the package" if package_path == local else None
        problem = problem or path_problem(package_path)
        if problem is not None:
            raise LedgerError(
                f"the ledger names {path!r}, which {problem}; nothing was written",
                str(self.directory),
            )
        linked = symlink_on_the_way(self.target, package_path)
        if linked is not None:
            raise RefusedError(
                f"{linked} is now a symbolic link to a directory; nothing was written"
            )
        location = self.target.path(package_path)
        if not location.parent.resolve().is_relative_to(self.target.package_dir.resolve()):
            raise LedgerError(
                f"the ledger names {path!r}, outside the target's package", str(self.directory)
            )
        return location

    def local(self, path: str) -> str:
        """A recorded path as this target spells it (a checkout adds `python/`)."""
        spelled_as_checkout = path.startswith("python/sglang/")
        if spelled_as_checkout == self.target.relative("").startswith("python/"):
            return path
        return _other_spelling(path)

    def original(self, path: str, digest: str) -> bytes:
        """The bytes `path` had before sglpatch first patched it; damage unless they hash to
        `digest`, the state's record of them."""
        return self.stored("original", path, digest)

    def require_git(self) -> None:
        """Before a change: a ledger that cannot commit stops it before anything is written."""
        self.repository.require_git()

    def history(self) -> list[Entry]:
        """Every change recorded for this target, newest first."""
        return self.repository.history()

    def stored(self, kind: str, path: str, digest: str | None = None) -> bytes:
        """Bytes saved by an earlier commit: kind is original, patched or edited. With `digest`
        (the state's sha256 of them), bytes that no longer match are damage."""
        folder = self.directory / "files" / kind
        for spelled in (path, _other_spelling(path)):
            location = folder / confined(spelled)
            try:
                data = read_regular(location, follow=False)
            except (FileNotFoundError, NotADirectoryError):
                continue
            except OSError as error:  # a FIFO, a device or a link is damage, never waited on
                reason = error.strerror or str(error)
                raise LedgerError(
                    f"the {kind} bytes of {path} are unreadable ({reason})", str(self.directory)
                ) from None
            if not location.resolve().is_relative_to(folder.resolve()):  # a linked folder
                raise LedgerError(
                    f"the {kind} bytes of {path} are reached through a symbolic link",
                    str(self.directory),
                )
            if digest is not None and sha256(data) != digest:
                raise LedgerError(f"the recorded {kind} of {path} is damaged", str(self.directory))
            return data
        raise LedgerError(f"the {kind} bytes of {path} are missing", str(self.directory))

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Hold this target's locks; wait up to `timeout` seconds (SGLPATCH_LOCK_TIMEOUT, 10).

        Two locks: the ledger's lock file for this target, and the target's own package folder
        (flock on the directory), so runs with different ledgers still exclude each other.
        """
        if timeout is None:
            timeout = lock_timeout()
        path = self.ledger.directory / "locks" / f"{self.key}.lock"
        _close_leaked(str(path))
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            ledger_fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as error:
            raise LedgerError(f"cannot create a lock: {error.strerror}", str(path.parent)) from None
        try:
            target_fd = os.open(self.target.package_dir, os.O_RDONLY)
        except OSError:
            os.close(ledger_fd)
            raise
        _open_locks[str(path)] = ((target_fd, self.target.package_dir), (ledger_fd, path))
        deadline = time.monotonic() + timeout
        held = False
        try:
            for fd in (target_fd, ledger_fd):
                self._acquire(fd, deadline, timeout)
            _holding.add(str(path))
            held = True
            yield
        finally:
            if held:  # first: what stays open after this is leaked, not held
                _holding.discard(str(path))
            # Closing releases the locks. A Ctrl-C between the two closes would leave the ledger's
            # lock held by a leaked descriptor for the rest of the process: hold it off.
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
            try:
                os.close(target_fd)
                os.close(ledger_fd)
                _open_locks.pop(str(path), None)
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})

    def _acquire(self, fd: int, deadline: float, timeout: float) -> None:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockedError(
                        f"another sglpatch is working on {self.target.root} "
                        f"(waited {timeout:g}s); try again when it is done"
                    ) from None
                time.sleep(0.05)

    def _init_store(self) -> None:
        readme = self.ledger.directory / "README.md"
        if not readme.exists():
            write_atomic(readme, README.encode())
        _register(self.ledger.directory)


# The lock descriptors of this process not closed yet, by lock file, each with what it opened.
# A Ctrl-C already pending when a run releases its locks can still end it before the closes (the
# signal mask holds off new ones only): they then stay open, holding the locks against this same
# process.
_open_locks: dict[str, tuple[tuple[int, Path], tuple[int, Path]]] = {}
_holding: set[str] = set()  # the lock files a run of this process holds now


def _close_leaked(lock_file: str) -> None:
    """Close the descriptors a run of this process left open on `lock_file` and its target, each
    only if it still is that file: a number closed meanwhile may have been reused."""
    if lock_file in _holding:  # held: the second holder must wait, as another process would
        return
    for fd, opened in _open_locks.pop(lock_file, ()):
        try:
            if os.path.samestat(os.fstat(fd), opened.stat()):
                os.close(fd)
        except OSError:
            continue
