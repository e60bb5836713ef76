"""The ledger: what sglpatch changed in each target, as git repositories that sglpatch owns.

`Ledger(directory)` is a store like pre-commit's: a README, one git repository per target under
`targets/` (keyed by the target's path, since its release changes on upgrade) and a lock per
target under `locks/`. Each repository's work tree holds `state.json` (what is applied now) and
`files/original/...`, `files/patched/...`, `files/edited/...`; every apply and revert is a commit.
Reads (`state`, `original`) are plain file reads; only writes and `history` load gitpython.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sglpatch.errors import LedgerError, LockedError, RefusedError
from sglpatch.fsio import fault_point, write_atomic
from sglpatch.target import Target

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

AUTHOR = ("sglpatch", "sglpatch@localhost")


def sha256(data: bytes) -> str:
    import hashlib  # OpenSSL's loader costs a dry run more than it hashes

    return hashlib.sha256(data).hexdigest()


def default_directory() -> Path:
    """`$SGLPATCH_LEDGER`, else `$XDG_STATE_HOME/sglpatch`, else `~/.local/state/sglpatch`."""
    if os.environ.get("SGLPATCH_LEDGER"):
        return Path(os.environ["SGLPATCH_LEDGER"]).expanduser()
    state_home = os.environ.get("XDG_STATE_HOME") or str(Path.home() / ".local" / "state")
    return Path(state_home) / "sglpatch"


@dataclass
class FileRecord:
    original: str  # sha256 of the bytes before sglpatch touched the file
    patched: str  # sha256 of the bytes sglpatch wrote
    patches: list[str]


@dataclass
class State:
    """What is applied to the target now, as recorded by the last apply or revert."""

    release: str | None = None
    patches: list[str] = field(default_factory=list)
    files: dict[str, FileRecord] = field(default_factory=dict)
    # Patches the user left out of an apply (--skip, --only, an interactive "n") on this release.
    skipped: list[str] = field(default_factory=list)

    def to_json(self) -> bytes:
        return (json.dumps(asdict(self), indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        files = {path: FileRecord(**record) for path, record in data.get("files", {}).items()}
        skipped = list(data.get("skipped", []))  # absent in ledgers from before --skip
        return cls(data.get("release"), list(data.get("patches", [])), files, skipped)


class Entry(NamedTuple):
    """One commit of a target's ledger."""

    commit: str
    date: str
    summary: str
    message: str


class Ledger:
    """The store of per-target ledgers in `directory`."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory.expanduser().absolute()

    def record(self, target: Target) -> Record:
        root = target.root.resolve()
        if self.directory.resolve().is_relative_to(root):
            raise RefusedError(
                f"the ledger {self.directory} is inside the target {root}; choose another --ledger"
            )
        slug = re.sub(r"[^A-Za-z0-9._-]+", "-", str(root)).strip("-")[-60:]
        key = f"{slug}-{sha256(str(root).encode())[:12]}"
        return Record(self, key, target)


class Record:
    """The ledger of one target: its state, its history and its lock."""

    def __init__(self, ledger: Ledger, key: str, target: Target) -> None:
        self.ledger = ledger
        self.key = key
        self.target = target
        self.directory = ledger.directory / "targets" / key

    def exists(self) -> bool:
        return (self.directory / "state.json").is_file()

    def state(self) -> State:
        path = self.directory / "state.json"
        if not path.exists():
            return State()
        try:
            data = json.loads(path.read_bytes())
            if not isinstance(data, dict):
                raise ValueError("not a JSON object")
            return State.from_json(data)
        except (OSError, ValueError, TypeError, AttributeError) as error:
            raise LedgerError(f"state.json is unreadable ({error})", str(self.directory)) from None

    def stored(self, kind: str, path: str) -> bytes:
        """Bytes saved by an earlier commit: kind is original, patched or edited."""
        try:
            return (self.directory / "files" / kind / path).read_bytes()
        except OSError:
            raise LedgerError(
                f"the {kind} bytes of {path} are missing", str(self.directory)
            ) from None

    @contextmanager
    def locked(self, timeout: float | None = None) -> Iterator[None]:
        """Hold this target's locks; wait up to `timeout` seconds (SGLPATCH_LOCK_TIMEOUT, 10).

        Two locks: the ledger's lock file for this target, and the target's own package folder
        (flock on the directory), so runs with different ledgers still exclude each other.
        """
        if timeout is None:
            timeout = float(os.environ.get("SGLPATCH_LOCK_TIMEOUT", "10"))
        path = self.ledger.directory / "locks" / f"{self.key}.lock"
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
        deadline = time.monotonic() + timeout
        try:
            for fd in (target_fd, ledger_fd):
                self._acquire(fd, deadline, timeout)
            yield
        finally:
            os.close(target_fd)  # closing releases the locks
            os.close(ledger_fd)

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

    def commit(self, message: str, state: State, files: Mapping[str, bytes]) -> str:
        """Write `files` (paths under files/) and the state, then commit them all at once.

        Committing what HEAD already holds makes no new commit, so a replayed journal is safe.
        """
        import git  # heavy: only writes and history need it

        try:
            repo = self._repo(create=True)
            written = []
            for relative, data in files.items():
                path = self.directory / "files" / relative
                write_atomic(path, data)
                written.append(str(path.relative_to(self.directory)))
            write_atomic(self.directory / "state.json", state.to_json())
            repo.index.add([*written, "state.json"])
            tree = repo.index.write_tree()
            parents = []
            if repo.head.is_valid():
                head = repo.head.commit
                self._check_objects(head)
                if head.tree.binsha == tree.binsha:
                    return str(head.hexsha)
                parents.append(head)
            fault_point("ledger-commit", self.directory)
            actor = git.Actor(*AUTHOR)
            commit = git.Commit.create_from_tree(
                repo, tree, message, parents, head=True, author=actor, committer=actor
            )
            return str(commit.hexsha)
        except (git.exc.GitError, OSError, ValueError) as error:
            raise LedgerError(f"cannot record the change ({error})", str(self.directory)) from None

    @staticmethod
    def _check_objects(head: Any) -> None:
        """Read every tree of HEAD: a ledger with missing objects must not take new records."""
        for _ in head.tree.traverse():
            pass

    def history(self) -> list[Entry]:
        import git

        if not self.directory.exists():
            return []
        try:
            repo = self._repo(create=False)
            if not repo.head.is_valid():
                return []
            return [
                Entry(
                    c.hexsha,
                    c.committed_datetime.isoformat(timespec="seconds"),
                    str(c.summary),
                    str(c.message),
                )
                for c in repo.iter_commits()
            ]
        except (git.exc.GitError, OSError, ValueError) as error:
            raise LedgerError(f"cannot read the history ({error})", str(self.directory)) from None

    def _repo(self, create: bool) -> Any:
        import git

        if not (self.directory / ".git").exists():
            if not create:
                raise LedgerError("not a git repository", str(self.directory))
            if self.directory.exists() and any(self.directory.iterdir()):
                raise LedgerError("exists but is not a git repository", str(self.directory))
            self._init_store()
            repo = git.Repo.init(self.directory)
            with repo.config_writer() as config:  # never depend on the user's git identity
                config.set_value("user", "name", AUTHOR[0])
                config.set_value("user", "email", AUTHOR[1])
                config.set_value("commit", "gpgsign", "false")
            write_atomic(
                self.directory / "target.json",
                (json.dumps({"target": str(self.target.root)}, indent=2) + "\n").encode(),
            )
            repo.index.add(["target.json"])
            return repo
        try:
            return git.Repo(self.directory, search_parent_directories=False)
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
            raise LedgerError("not a git repository", str(self.directory)) from None

    def _init_store(self) -> None:
        readme = self.ledger.directory / "README.md"
        if not readme.exists():
            write_atomic(readme, README.encode())
