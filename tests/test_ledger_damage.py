"""A damaged or hostile ledger: never a write outside the package, never a silent "not applied",
never a hang; git missing or a bad lock timeout is one line."""

from __future__ import annotations

import base64
import fcntl
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.store import journal, ledger
from sglpatch.store.git import COMMITTED
from sglpatch.target import find_target
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parent.parent


def one_line(result: object, code: int, *words: str) -> None:
    stderr = str(getattr(result, "stderr", ""))
    assert getattr(result, "exit_code", getattr(result, "returncode", None)) == code, stderr
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglpatch: error: "), stderr
    assert all(word in lines[0] for word in words), lines[0]


def record_of(site: Path) -> ledger.Record:
    return ledger.Ledger(ledger.default_directory()).record(find_target(site, None))


def everything(root: Path) -> dict[str, bytes]:
    return {str(p): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.mark.parametrize(
    "spelling", ["sglang/../../outside.py", "ABSOLUTE", "sglang/srt//../../../outside.py"]
)
@pytest.mark.parametrize("command", ["apply", "revert", "status"])
def test_a_journal_naming_a_path_outside_the_package_writes_nothing(
    runner: CliRunner, site_059: Path, tmp_path: Path, spelling: str, command: str
) -> None:
    """The issue's repro: a pending journal whose write names a file outside the package, with a
    `before` hash that matches the outside file so a replay would take it for its own."""
    outside = site_059.parent / "outside.py"
    outside.write_bytes(b"precious\n")
    path = str(outside) if spelling == "ABSOLUTE" else spelling
    if command != "apply":
        assert api.apply(site_059, None).written
    record = record_of(site_059)
    state = json.loads(record.state().to_json())
    hostile = {
        "action": "apply",
        "message": "apply: hostile",
        "state": state,
        "previous": state,
        "ledger_files": {},
        "writes": [
            {
                "path": path,
                "before": hashlib.sha256(b"precious\n").hexdigest(),
                "after": base64.b64encode(b"owned\n").decode(),
            }
        ],
    }
    pending = journal.journal_path(record)
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(json.dumps(hostile))
    before = everything(tmp_path)
    result = runner.invoke(app, [command, "--target", str(site_059)])
    one_line(result, ExitCode.LEDGER, repr(path))
    assert outside.read_bytes() == b"precious\n"
    assert everything(tmp_path) == before


@pytest.mark.parametrize("points", ["inside", "outside"])
@pytest.mark.parametrize("command", ["apply", "revert"])
def test_a_journal_never_replaces_a_symbolic_link_in_the_package(
    runner: CliRunner, site_059: Path, points: str, command: str
) -> None:
    """A crafted journal whose write names a link in the package, with a `before` hash that
    matches the file the link points to: the replay put a regular file where the link was."""
    assert api.apply(site_059, None).written
    pointed = site_059 / "sglang" / "version.py" if points == "inside" else site_059.parent / "o.py"
    if points == "outside":
        pointed.write_bytes(b"precious\n")
    link = site_059 / "sglang" / "srt" / "linked.py"
    link.symlink_to(pointed)
    record = record_of(site_059)
    state = json.loads(record.state().to_json())
    hostile = {
        "action": "apply",
        "message": "apply: hostile",
        "state": state,
        "previous": state,
        "ledger_files": {},
        "writes": [
            {
                "path": "sglang/srt/linked.py",
                "before": hashlib.sha256(pointed.read_bytes()).hexdigest(),
                "after": base64.b64encode(b"owned\n").decode(),
            }
        ],
    }
    pending = journal.journal_path(record)
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(json.dumps(hostile))
    kept = pointed.read_bytes()
    result = runner.invoke(app, [command, "--target", str(site_059)])
    if command == "apply":
        one_line(result, ExitCode.TARGET, str(link), "a symbolic link")
    else:  # a journal that cannot be finished never blocks revert: undone, then reverted
        assert result.exit_code == 0, result.stderr
        assert not journal.journal_path(record).exists()
    assert link.is_symlink() and link.readlink() == pointed and pointed.read_bytes() == kept


def damage(site: Path, how: str) -> Path:
    """Apply, then damage the ledger's git repository `how`; the committed-state mark goes too."""
    assert api.apply(site, None).written
    git_dir = record_of(site).directory / ".git"
    (git_dir / COMMITTED).unlink()
    branch = git_dir / "refs" / "heads" / "master"
    if how == "garbage HEAD":
        (git_dir / "HEAD").write_text("garbage\n")
    elif how == "missing commit":
        branch.write_text("1234567890123456789012345678901234567890\n")
    elif how == "empty branch":
        branch.write_text("")
    elif how == "deleted branch":
        branch.unlink()
    return git_dir


@pytest.mark.parametrize(
    "how", ["garbage HEAD", "missing commit", "empty branch", "deleted branch"]
)
def test_a_damaged_ledger_is_exit_4_never_a_silent_success(
    runner: CliRunner, site_059: Path, how: str
) -> None:
    damage(site_059, how)
    patched = snapshot(site_059)
    for command in (
        ["status"],
        ["apply"],
        ["revert"],
        ["revert", "--force"],
        ["status", "--check"],
        ["log"],  # said "No history" (exit 0) or was an internal error (70)
    ):
        result = runner.invoke(app, [*command, "--target", str(site_059)])
        one_line(result, ExitCode.LEDGER, "damaged", str(record_of(site_059).directory))
        assert snapshot(site_059) == patched, command


def test_a_first_commit_cut_short_is_not_damage(site_059: Path) -> None:
    """No commit yet but a journal waiting: the next run finishes it (as the crash tests do)."""
    git_dir = damage(site_059, "deleted branch")
    record = record_of(site_059)
    pending = journal.journal_path(record)
    pending.parent.mkdir(parents=True, exist_ok=True)
    pending.write_text(
        json.dumps(
            {
                "action": "apply",
                "message": "apply",
                "state": json.loads((record.directory / "state.json").read_bytes()),
                "previous": None,
                "ledger_files": {},
                "writes": [],
            }
        )
    )
    assert git_dir.is_dir()
    assert api.status(site_059).interrupted == "apply"
    api.apply(site_059, None)
    assert api.status(site_059).interrupted is None
    assert {r.state for r in api.status(site_059).patches} >= {"applied"}


def test_a_fifo_in_another_ledger_never_hangs(site_059: Path, tmp_path: Path) -> None:
    """Another ledger (listed in known-ledgers) whose state.json and target.json are FIFOs, and a
    FIFO for known-ledgers itself: status, apply --dry-run and revert answer at once."""
    other = tmp_path / "other-ledger"
    elsewhere = wheels.site_packages(SEED, tmp_path / "elsewhere", wheels.patch_targets(SEED))
    assert api.apply(elsewhere, None, other).written
    for folder in (other / "targets").iterdir():
        for name in ("state.json", "target.json"):
            (folder / name).unlink()
            os.mkfifo(folder / name)
    assert other in ledger.known_ledgers()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for argv in (["status"], ["apply", "--dry-run"], ["revert"]):
        run = subprocess.run(
            [sys.executable, "-m", "sglpatch", *argv, "--target", str(site_059)],
            capture_output=True, text=True, timeout=60, env=env, check=False,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr
    known = ledger.default_directory() / ledger.KNOWN_LEDGERS
    known.unlink()
    os.mkfifo(known)
    assert ledger.known_ledgers() == []
    run = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status", "--target", str(site_059)],
        capture_output=True, text=True, timeout=60, env=env, check=False,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr


def test_a_ledger_path_with_a_newline_is_listed_whole(site_059: Path, tmp_path: Path) -> None:
    odd = tmp_path / "a\nb"
    assert api.apply(site_059, None, odd).written
    assert odd in ledger.known_ledgers()
    listed = json.loads((ledger.default_directory() / ledger.KNOWN_LEDGERS).read_text())
    assert listed == [str(odd)]
    # an older sglpatch's list (a path a line) is still read
    (ledger.default_directory() / ledger.KNOWN_LEDGERS).write_text(f"{tmp_path / 'x'}\n")
    assert ledger.known_ledgers() == [tmp_path / "x"]


def without_git(tmp_path: Path) -> dict[str, str]:
    """PATH holding only a python3 stub: no git anywhere on it."""
    bin_dir = tmp_path / "nogit"
    bin_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_PYTHON")}
    return {**env, "PATH": str(bin_dir), "PYTHONPATH": str(REPO)}


def test_without_git_changes_stop_in_one_line_and_status_works(
    site_059: Path, tmp_path: Path
) -> None:
    env = without_git(tmp_path)

    def run(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "sglpatch", *argv, "--target", str(site_059)],
            capture_output=True, text=True, env=env, check=False,
        )  # fmt: skip

    before = snapshot(site_059)
    for argv in (["apply"], ["revert"], ["log"]):
        result = run(*argv)
        assert result.returncode == ExitCode.LEDGER, (argv, result.stderr)
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "needs git for its ledger; install git" in lines[0], lines
        assert snapshot(site_059) == before
    assert not (ledger.default_directory() / "pending").exists() or not list(
        (ledger.default_directory() / "pending").iterdir()
    )
    assert run("status").returncode == 0
    assert run("status", "--check").returncode == ExitCode.NOT_IN_PLACE  # answered: not patched
    assert api.apply(site_059, None).written  # with git, as ever
    assert run("status").returncode == 0
    assert run("status", "--check").returncode == 0


@pytest.mark.parametrize("value", ["abc", "nan", "inf", "-1"])
def test_a_bad_lock_timeout_is_a_usage_error(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch, value: str
) -> None:
    monkeypatch.setenv("SGLPATCH_LOCK_TIMEOUT", value)
    before = snapshot(site_059)
    result = runner.invoke(app, ["apply", "--target", str(site_059)])
    one_line(result, ExitCode.USAGE, "SGLPATCH_LOCK_TIMEOUT", repr(value))
    assert snapshot(site_059) == before


def test_a_lock_left_open_by_an_interrupted_run_of_this_process_is_closed(tmp_path: Path) -> None:
    # A Ctrl-C pending as a run releases its locks can end it before the closes; the next run
    # in the same process must not wait on the descriptors it left.
    site = wheels.site_packages(SEED, tmp_path / "site", ())
    target = find_target(site, None)
    record = ledger.Ledger(tmp_path / "ledger").record(target)
    with record.locked(timeout=0):
        leaked = dict(ledger._open_locks)
    ((key, fds),) = leaked.items()
    ledger._open_locks.clear()
    # what an interrupted release leaves: both descriptors open, the locks held
    reopened = tuple((os.open(opened, os.O_RDONLY), opened) for _, opened in fds)
    for fd, _ in reopened:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    ledger._open_locks[key] = reopened  # type: ignore[assignment]
    with record.locked(timeout=0):  # no LockedError: the leaked ones were closed first
        pass
    for fd, _ in reopened:
        with pytest.raises(OSError):
            os.fstat(fd)


DEEP = b"[" * 100_000 + b"]" * 100_000  # nested past the JSON parser's stack


@pytest.mark.parametrize("where", ["known-ledgers", "state.json", "journal"])
def test_json_nested_too_deep_is_ledger_damage(
    runner: CliRunner, site_059: Path, tmp_path: Path, where: str
) -> None:
    """Each was an internal error (exit 70, RecursionError) where it was read."""
    commands: list[list[str]] = [["revert"], ["apply"]]
    if where == "known-ledgers":  # read to look for other records of files not applied here
        (ledger.default_directory()).mkdir(parents=True, exist_ok=True)
        (ledger.default_directory() / ledger.KNOWN_LEDGERS).write_bytes(DEEP)
        commands = [["status"], ["apply", "--ledger", str(tmp_path / "other")]]
        words = [ledger.KNOWN_LEDGERS, "nested too deep"]
    else:
        assert api.apply(site_059, None).written
        record = record_of(site_059)
        if where == "state.json":
            (record.directory / "state.json").write_bytes(DEEP)
            (record.directory / ".git" / COMMITTED).write_text(hashlib.sha256(DEEP).hexdigest())
            commands.append(["status"])
            words = ["state.json is unreadable"]
        else:
            pending = journal.journal_path(record)
            pending.parent.mkdir(parents=True, exist_ok=True)
            pending.write_bytes(DEEP)
            words = ["journal", "unreadable"]
    before = snapshot(site_059)
    for command in commands:
        result = runner.invoke(app, [*command, "--target", str(site_059)])
        one_line(result, ExitCode.LEDGER, *words)
    assert snapshot(site_059) == before


def test_a_run_killed_while_the_record_is_made_strands_nothing(
    site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The record's repository is made beside its place and renamed there: a process killed
    while `git init` writes `.git` (here: interrupted after the folder is made) leaves a stray
    folder, which the next run removes, not a record whose `.git` is no repository (which
    every later run refused: 'not a git repository', exit 4)."""
    import git

    real = git.Repo.init

    def killed(path: str | Path, *args: object, **kwargs: object) -> object:
        (Path(path) / ".git").mkdir(parents=True)
        raise KeyboardInterrupt  # as a kill would stop it, `.git` begun and not finished

    monkeypatch.setattr(git.Repo, "init", killed)
    with pytest.raises(KeyboardInterrupt):
        api.apply(site_059, None)
    monkeypatch.setattr(git.Repo, "init", real)
    assert api.apply(site_059, None).written
    records = list(api.status(site_059).ledger.parent.iterdir())
    assert not [p for p in records if ".init-" in p.name], records
