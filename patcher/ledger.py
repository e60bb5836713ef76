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
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from sglpatch.errors import LedgerError, LockedError, RefusedError, UsageError
from sglpatch.fsio import fault_point, read_regular, sha256, write_atomic
from sglpatch.patch import path_problem
from sglpatch.target import Target, symlink_on_the_way

__all__ = ["Entry", "FileRecord", "Ledger", "Record", "State", "default_directory", "sha256"]

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

AUTHOR = ("sglpatch", "sglpatch@localhost")


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


@dataclass
class FileRecord:
    original: str  # sha256 of the bytes before sglpatch touched the file
    patched: str  # sha256 of the bytes sglpatch wrote
    patches: list[str]
    # Keys a newer sglpatch wrote that this one does not know: kept, written back unchanged.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class State:
    """What is applied to the target now, as recorded by the last apply or revert."""

    release: str | None = None
    patches: list[str] = field(default_factory=list)
    files: dict[str, FileRecord] = field(default_factory=dict)
    # Patches the user left out of an apply (--skip, --only, an interactive "n") on this release.
    skipped: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> bytes:
        files = {
            path: {**f.extra, "original": f.original, "patched": f.patched, "patches": f.patches}
            for path, f in self.files.items()
        }
        data = {
            **self.extra,
            "release": self.release,
            "patches": self.patches,
            "files": files,
            "skipped": self.skipped,
        }
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        files = {}
        for path, record in data.get("files", {}).items():
            extra = {k: v for k, v in record.items() if k not in ("original", "patched", "patches")}
            files[path] = FileRecord(
                record["original"], record["patched"], list(record["patches"]), extra
            )
        known = ("release", "patches", "files", "skipped")
        extra = {k: v for k, v in data.items() if k not in known}
        skipped = list(data.get("skipped", []))  # absent in ledgers from before --skip
        return cls(data.get("release"), list(data.get("patches", [])), files, skipped, extra)

    def with_paths(self, rename: Callable[[str], str]) -> State:
        """The same state with every file path passed through `rename`."""
        files = {rename(path): record for path, record in self.files.items()}
        return State(self.release, self.patches, files, self.skipped, self.extra)


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
                except (OSError, ValueError, TypeError, AttributeError, KeyError):
                    continue
                for path, patched in recorded:
                    if path not in digests:
                        digests[path] = _digest_or_none(record.target.root, path)
                    if digests[path] == patched:
                        found.setdefault(path, (folder, str(owner)))
        return found


def _digest_or_none(root: Path, path: str) -> str | None:
    try:
        return sha256(read_regular(root / _confined(path)))
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
    try:
        raw = read_regular(default_directory() / KNOWN_LEDGERS, HINT_LIMIT)
    except OSError:
        return []
    text = raw.decode("utf-8", errors="surrogateescape")
    try:
        listed = json.loads(text)
    except ValueError:
        return [Path(line) for line in text.splitlines() if line.strip()]
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


# Beside HEAD, in .git (untracked): the sha256 of the state.json HEAD holds. A work-tree
# state.json that differs was written by a commit that never happened: HEAD is the truth.
COMMITTED = "sglpatch-committed-state"


def _other_spelling(path: str) -> str:
    """`sglang/x` as a checkout spells it (`python/sglang/x`), and back."""
    if path.startswith("python/sglang/"):
        return path.removeprefix("python/")
    return f"python/{path}"


def _confined(relative: str) -> str:
    parts = relative.split("/")
    if relative.startswith("/") or "\\" in relative or any(p in ("", ".", "..") for p in parts):
        raise LedgerError(f"refusing a path outside the ledger's files: {relative!r}")
    return relative


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
        """The committed state, with file paths as this target spells them."""
        data = self._committed_state_bytes()
        if data is None:
            return State()
        try:
            parsed = json.loads(data)
            if not isinstance(parsed, dict):
                raise ValueError("not a JSON object")
            state = State.from_json(parsed)
        except (ValueError, TypeError, AttributeError, KeyError) as error:
            raise LedgerError(f"state.json is unreadable ({error})", str(self.directory)) from None
        return state.with_paths(self.local)

    def _committed_state_bytes(self) -> bytes | None:
        """state.json as HEAD holds it: a plain read when the work tree agrees with HEAD."""
        path = self.directory / "state.json"
        try:
            data = read_regular(path)
        except FileNotFoundError:
            data = None
        except OSError as error:
            raise LedgerError(f"state.json is unreadable ({error})", str(self.directory)) from None
        git_dir = self.directory / ".git"
        if not git_dir.is_dir():
            return data
        try:
            committed = (git_dir / COMMITTED).read_text().strip()
        except OSError:
            committed = None
        if data is not None and committed == sha256(data):
            return data
        return self._head_state()

    def _head_state(self) -> bytes | None:
        """state.json from HEAD, via the git command (gitpython costs status too much).

        None only when nothing was ever committed. A HEAD git cannot read, a branch naming a
        missing or empty commit, or a work tree recording files with no commit behind it is a
        damaged ledger: believing it would show patched files as "not applied".
        """
        import subprocess

        def git(*args: str) -> subprocess.CompletedProcess[bytes]:
            return subprocess.run(
                ["git", "-C", str(self.directory), *args], capture_output=True, check=False
            )

        try:
            if git("rev-parse", "-q", "--verify", "HEAD^{commit}").returncode != 0:
                self._check_unborn()
                return None  # no commit yet: nothing was ever recorded
            shown = git("cat-file", "blob", "HEAD:state.json")
        except OSError as error:
            raise self._needs_git(error) from None
        if shown.returncode != 0:
            raise LedgerError("HEAD holds no state.json", str(self.directory))
        return shown.stdout

    def _check_unborn(self) -> None:
        """Raise unless HEAD is a branch with no commit yet (a ledger whose first commit failed)."""
        import subprocess

        try:
            head = subprocess.run(
                ["git", "-C", str(self.directory), "symbolic-ref", "-q", "HEAD"],
                capture_output=True,
                check=False,
            )
        except OSError as error:
            raise self._needs_git(error) from None
        branch = head.stdout.decode(errors="replace").strip()
        head_is = f"names {branch}" if branch else "is unreadable"
        damaged = LedgerError(
            f"its git repository is damaged (HEAD {head_is}, which holds no commit); "
            "sglpatch cannot tell what it applied. Repair it with git, "
            "or restore the ledger from a backup",
            str(self.directory),
        )
        if head.returncode != 0 or not branch.startswith("refs/heads/"):
            raise damaged
        git_dir = self.directory / ".git"
        packed = git_dir / "packed-refs"
        if (git_dir / branch).exists() or (
            packed.is_file() and f" {branch}" in packed.read_text(errors="replace")
        ):
            raise damaged  # the branch exists but names nothing readable
        if (self.ledger.directory / "pending" / f"{self.key}.json").exists():
            return  # a first commit cut short: its journal finishes it
        try:
            recorded = json.loads(read_regular(self.directory / "state.json")).get("files")
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError):
            raise damaged from None
        if recorded:
            raise damaged

    def drop_lock_left_since(self, started: float) -> None:
        """Remove git's index.lock if a run killed while committing left it (made since
        `started`, when that run wrote its journal): held by no one, it would block every commit.
        One older than the journal is someone else's, and stays."""
        lock = self.directory / ".git" / "index.lock"
        with contextlib.suppress(OSError):
            if lock.stat().st_mtime >= started:
                lock.unlink()

    def _git(self) -> Any:
        """gitpython, which fails to import without a git command: a ledger problem, one line."""
        try:
            import git
        except ImportError as error:
            raise self._needs_git(str(error).splitlines()[0]) from None
        return git

    def require_git(self) -> None:
        """Before a change: a ledger that cannot commit must stop it before anything is written."""
        import shutil

        if shutil.which("git") is None and not os.environ.get("GIT_PYTHON_GIT_EXECUTABLE"):
            raise self._needs_git("no git command on PATH")
        self._git()

    def _needs_git(self, error: object) -> LedgerError:
        return LedgerError(
            f"sglpatch needs git for its ledger; install git ({error})", str(self.directory)
        )

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

    def stored(self, kind: str, path: str) -> bytes:
        """Bytes saved by an earlier commit: kind is original, patched or edited."""
        for spelled in (path, _other_spelling(path)):
            try:
                return (self.directory / "files" / kind / _confined(spelled)).read_bytes()
            except OSError:
                continue
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
        If the commit fails, the work tree gets its old bytes back: what `state()` reads stays
        what HEAD holds, so a failed revert leaves everything revertable.
        """
        git = self._git()  # heavy: only writes and history need it

        paths = [
            *(self.directory / "files" / _confined(relative) for relative in files),
            self.directory / "state.json",
        ]
        try:
            repo = self._repo(create=True)
            if not repo.head.is_valid():
                self._check_unborn()  # a damaged HEAD must not be written over with a new root
            before = {path: _read_or_none(path) for path in paths}
        except (git.exc.GitError, OSError, ValueError, AssertionError) as error:
            # gitpython asserts on some damage (an empty branch ref)
            raise LedgerError(f"cannot record the change ({error})", str(self.directory)) from None
        tree = None
        try:
            for data, path in zip(files.values(), paths[:-1], strict=True):
                write_atomic(path, data)
            write_atomic(paths[-1], state.to_json())
            repo.index.add([str(path.relative_to(self.directory)) for path in paths])
            tree = repo.index.write_tree()
            parents = []
            commit_sha = None
            if repo.head.is_valid():
                head = repo.head.commit
                self._check_objects(head)
                if head.tree.binsha == tree.binsha:
                    commit_sha = str(head.hexsha)
                else:
                    parents.append(head)
            if commit_sha is None:
                fault_point("ledger-commit", self.directory)
                actor = git.Actor(*AUTHOR)
                commit = git.Commit.create_from_tree(
                    repo, tree, message, parents, head=True, author=actor, committer=actor
                )
                commit_sha = str(commit.hexsha)
        except Exception as error:
            landed = self._head_sha_if_tree(repo, tree)
            if landed is not None:  # HEAD moved before the error (a reflog write): it stands
                self._mark_committed(state.to_json())
                return landed
            self._roll_back(repo, before)
            if isinstance(error, (git.exc.GitError, OSError, ValueError)):
                raise LedgerError(
                    f"cannot record the change ({error})", str(self.directory)
                ) from None
            raise
        except BaseException:  # Ctrl-C outside carry_out's hold, SystemExit
            if self._head_sha_if_tree(repo, tree) is None:
                self._roll_back(repo, before)
            raise
        self._mark_committed(state.to_json())
        return commit_sha

    @staticmethod
    def _head_sha_if_tree(repo: Any, tree: Any) -> str | None:
        try:
            if tree is not None and repo.head.is_valid():
                head = repo.head.commit
                if head.tree.binsha == tree.binsha:
                    return str(head.hexsha)
        except Exception:  # HEAD unreadable: it did not take our commit
            return None
        return None

    def _mark_committed(self, data: bytes) -> None:
        # Without the mark, reads take state.json from HEAD: slower, still right.
        with contextlib.suppress(OSError):
            write_atomic(self.directory / ".git" / COMMITTED, (sha256(data) + "\n").encode())

    def _roll_back(self, repo: Any, before: Mapping[Path, bytes | None]) -> None:
        """Put the work tree and the index back as HEAD has them after a commit that failed."""
        for path, data in before.items():
            try:
                if data is None:
                    path.unlink(missing_ok=True)
                else:
                    write_atomic(path, data)
            except OSError:
                continue  # the committed-state mark still makes reads take HEAD
        with contextlib.suppress(Exception):
            if repo.head.is_valid():
                repo.index.reset()

    @staticmethod
    def _check_objects(head: Any) -> None:
        """Read every tree of HEAD: a ledger with missing objects must not take new records."""
        for _ in head.tree.traverse():
            pass

    def history(self) -> list[Entry]:
        git = self._git()

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
        git = self._git()

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
        _register(self.ledger.directory)


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
