"""The git repository behind one target's record: reading what HEAD holds, committing changes.

Reads go through the git command (one short process) only when the work tree and HEAD may
disagree; writes and history load gitpython. A HEAD that git cannot read is a damaged ledger,
never "nothing recorded".
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from sglpatch.errors import LedgerError
from sglpatch.reading import read_regular
from sglpatch.store.fsio import fault_point, sha256, write_atomic
from sglpatch.store.state import Entry, State

AUTHOR = ("sglpatch", "sglpatch@localhost")

# Beside HEAD, in .git (untracked): the sha256 of the state.json HEAD holds. A work-tree
# state.json that differs was written by a commit that never happened: HEAD is the truth.
COMMITTED = "sglpatch-committed-state"


def confined(relative: str) -> str:
    """A path under the record's `files/` as the ledger names it: relative, no `..`."""
    parts = relative.split("/")
    if relative.startswith("/") or "\\" in relative or any(p in ("", ".", "..") for p in parts):
        raise LedgerError(f"refusing a path outside the ledger's files: {relative!r}")
    return relative


class Repository:
    """The git repository in `directory` (a target's record).

    `pending` is the journal a change cut short leaves: while it waits, a branch with no commit
    is a first commit to finish, not damage. `on_create` runs before the repository is made (the
    store's README and registration); `owner` is the target root written to `target.json`.
    """

    def __init__(
        self, directory: Path, pending: Path, owner: Path, on_create: Callable[[], None]
    ) -> None:
        self.directory = directory
        self.pending = pending
        self.owner = owner
        self.on_create = on_create

    def committed_state_bytes(self) -> bytes | None:
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
            committed = read_regular(git_dir / COMMITTED, 4096).decode(errors="replace").strip()
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
            packed.is_file() and f" {branch}".encode() in read_regular(packed)
        ):
            raise damaged  # the branch exists but names nothing readable
        if self.pending.exists():
            return  # a first commit cut short: its journal finishes it
        try:
            recorded = json.loads(read_regular(self.directory / "state.json")).get("files")
        except FileNotFoundError:
            return
        except (OSError, ValueError, AttributeError, RecursionError):
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

    def commit(self, message: str, state: State, files: Mapping[str, bytes]) -> str:
        """Write `files` (paths under files/) and the state, then commit them all at once.

        Committing what HEAD already holds makes no new commit, so a replayed journal is safe.
        If the commit fails, the work tree gets its old bytes back: what `state()` reads stays
        what HEAD holds, so a failed revert leaves everything revertable.
        """
        git = self._git()  # heavy: only writes and history need it

        paths = [
            *(self.directory / "files" / confined(relative) for relative in files),
            self.directory / "state.json",
        ]
        repo, before = self._open_for_commit(git, paths)
        tree = None
        try:
            for data, path in zip(files.values(), paths[:-1], strict=True):
                write_atomic(path, data)
            write_atomic(paths[-1], state.to_json())
            repo.index.add([str(path.relative_to(self.directory)) for path in paths])
            tree = repo.index.write_tree()
            commit_sha = self._commit_tree(git, repo, tree, message)
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
        finally:
            # Its git processes stop here, not in a garbage collection later, where a Ctrl-C
            # arriving in `Repo.__del__` is printed and dropped instead of stopping the run.
            repo.close()
        self._mark_committed(state.to_json())
        return commit_sha

    def _open_for_commit(self, git: Any, paths: list[Path]) -> tuple[Any, dict[Path, bytes | None]]:
        """The repository (made if need be) and the bytes `paths` hold now, to roll back to."""
        try:
            repo = self._repo(create=True)
            try:
                if not repo.head.is_valid():
                    self._check_unborn()  # a damaged HEAD must not be written over with a root
                return repo, {path: _read_or_none(path) for path in paths}
            except BaseException:
                repo.close()
                raise
        except (git.exc.GitError, OSError, ValueError, AssertionError) as error:
            # gitpython asserts on some damage (an empty branch ref)
            raise LedgerError(f"cannot record the change ({error})", str(self.directory)) from None

    def _commit_tree(self, git: Any, repo: Any, tree: Any, message: str) -> str:
        """A commit of `tree` on HEAD; HEAD itself when it already holds `tree` (a replay)."""
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
            with self._repo(create=False) as repo:  # closed here, as in `commit`
                if not repo.head.is_valid():
                    self._check_unborn()  # damage is not "no history"
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
        except (git.exc.GitError, OSError, ValueError, AssertionError) as error:
            # gitpython asserts on some damage (an empty branch ref)
            raise LedgerError(f"cannot read the history ({error})", str(self.directory)) from None

    def _repo(self, create: bool) -> Any:
        git = self._git()

        if not (self.directory / ".git").exists():
            if not create:
                raise LedgerError("not a git repository", str(self.directory))
            if self.directory.exists() and any(self.directory.iterdir()):
                raise LedgerError("exists but is not a git repository", str(self.directory))
            self.on_create()
            self._init_beside(git)
        try:
            return git.Repo(self.directory, search_parent_directories=False)
        except (git.exc.InvalidGitRepositoryError, git.exc.NoSuchPathError):
            raise LedgerError("not a git repository", str(self.directory)) from None

    def _init_beside(self, git: Any) -> None:
        """Make the repository in a folder beside its place, then rename it there: a process
        killed while git writes `.git` leaves a stray folder (removed by the next run), never a
        record that is neither absent nor a repository, which every later run would refuse."""
        parent = self.directory.parent
        parent.mkdir(parents=True, exist_ok=True)
        for stray in parent.glob(f".{self.directory.name}.init-*"):
            shutil.rmtree(stray, ignore_errors=True)
        building = parent / f".{self.directory.name}.init-{os.getpid()}"
        repo = git.Repo.init(building)
        with repo.config_writer() as config:  # never depend on the user's git identity
            config.set_value("user", "name", AUTHOR[0])
            config.set_value("user", "email", AUTHOR[1])
            config.set_value("commit", "gpgsign", "false")
        write_atomic(
            building / "target.json",
            (json.dumps({"target": str(self.owner)}, indent=2) + "\n").encode(),
        )
        repo.index.add(["target.json"])
        repo.close()
        building.replace(self.directory)  # onto nothing, or onto an empty folder


def _read_or_none(path: Path) -> bytes | None:
    try:
        return read_regular(path, follow=False)
    except FileNotFoundError:
        return None
