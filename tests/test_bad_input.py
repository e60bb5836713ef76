"""Bad input: a one-line message, a documented exit code, and the target untouched."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.store import fsio
from tests.conftest import snapshot
from tests.support import proofs, wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
KIMI = "sglang/srt/models/kimi_k25.py"


def fails(runner: CliRunner, site: Path, code: int, words: list[str], *args: str) -> None:
    before = snapshot(site)
    result = runner.invoke(app, [*(args or ("apply",)), "--target", str(site)])
    assert result.exit_code == code, (result.stdout, result.stderr)
    error = result.stderr.strip().splitlines()
    assert len(error) == 1 and error[0].startswith("sglpatch: error: "), result.stderr
    assert all(w in error[0] for w in words), error[0]
    assert "Traceback" not in result.stderr
    assert snapshot(site) == before


def test_a_file_that_is_not_utf8(runner: CliRunner, site_059: Path) -> None:
    kimi = site_059 / KIMI
    kimi.write_bytes(
        kimi.read_bytes().replace(b"# Load language model weights", b"# Gewichte \xfc")
    )
    fails(runner, site_059, ExitCode.TARGET, [KIMI, "not UTF-8"])


def test_crlf_files_are_patched_in_their_own_line_endings(
    runner: CliRunner, site_059: Path
) -> None:
    for member in wheels.patch_targets(SEED):
        path = site_059 / member
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
    pristine = snapshot(site_059)
    assert runner.invoke(app, ["apply", "--target", str(site_059)]).exit_code == 0
    changed = wheels.applied_targets(SEED)
    for member in wheels.patch_targets(SEED):
        data = (site_059 / member).read_bytes()
        assert (data != pristine[member]) == (member in changed)
        assert data.count(b"\n") == data.count(b"\r\n")
    table = proofs.size_table(
        (site_059 / SIZES).read_bytes(), "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
    )
    assert table[12] == table[10]
    assert runner.invoke(app, ["revert", "--target", str(site_059)]).exit_code == 0
    assert snapshot(site_059) == pristine


def test_a_symlinked_file_is_refused(runner: CliRunner, site_059: Path, tmp_path: Path) -> None:
    real = tmp_path / "elsewhere.py"
    shutil.move(site_059 / SIZES, real)
    (site_059 / SIZES).symlink_to(real)
    fails(runner, site_059, ExitCode.TARGET, [SIZES, "symbolic link"])


def test_a_corrupt_state_file(runner: CliRunner, site_059: Path) -> None:
    report = api.apply(site_059, None)
    # Only a committed state counts: a work tree that differs from HEAD is ignored, so the
    # corruption is committed (as a damaged disk or a hand edit plus `git commit` would).
    (report.ledger / "state.json").write_text("{not json")
    git = ["git", "-C", str(report.ledger), "-c", "user.name=x", "-c", "user.email=x@x"]
    subprocess.run([*git, "commit", "-qam", "damage"], check=True)
    fails(runner, site_059, ExitCode.LEDGER, ["state.json is unreadable"])
    fails(runner, site_059, ExitCode.LEDGER, ["state.json is unreadable"], "revert")
    fails(runner, site_059, ExitCode.LEDGER, ["state.json is unreadable"], "status")


def test_a_ledger_missing_objects(runner: CliRunner, site_059: Path) -> None:
    report = api.apply(site_059, None)
    objects = report.ledger / ".git" / "objects"
    for folder in objects.iterdir():
        if len(folder.name) == 2:
            shutil.rmtree(folder)
    # Caught before anything is staged: HEAD names a commit the ledger no longer holds.
    fails(runner, site_059, ExitCode.LEDGER, ["git repository is damaged"], "revert")
    assert not list(site_059.rglob("*.sglpatch"))


def test_a_ledger_that_is_not_a_git_repository(runner: CliRunner, site_059: Path) -> None:
    report = api.apply(site_059, None)
    api.revert(site_059)
    shutil.rmtree(report.ledger / ".git")
    fails(runner, site_059, ExitCode.LEDGER, ["not a git repository"])
    fails(runner, site_059, ExitCode.LEDGER, ["not a git repository"], "log")


def test_a_ledger_path_that_is_a_file(runner: CliRunner, site_059: Path, tmp_path: Path) -> None:
    blocker = tmp_path / "ledger"
    blocker.write_text("")
    fails(runner, site_059, ExitCode.LEDGER, ["cannot"], "apply", "--ledger", str(blocker))


def test_no_git_identity_anywhere(site_059: Path, tmp_path: Path) -> None:
    """No user.name, no EMAIL, no global or system config: the ledger still commits."""
    home = tmp_path / "bare-home"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GIT_", "EMAIL"))}
    env.update(HOME=str(home), XDG_STATE_HOME=str(home / "state"), GIT_CONFIG_NOSYSTEM="1")
    result = subprocess.run(
        [sys.executable, "-m", "sglpatch", "apply", "--target", str(site_059)],
        capture_output=True, text=True, env=env, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    ledger = next((home / "state" / "sglpatch" / "targets").iterdir())
    author = subprocess.run(
        ["git", "-C", str(ledger), "log", "-1", "--format=%an <%ae>"],
        capture_output=True, text=True, env=env, check=True,
    ).stdout.strip()  # fmt: skip
    assert author == "sglpatch <sglpatch@localhost>"


def test_a_read_only_target(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second file cannot be written: nothing changes, nothing is recorded."""
    seen: list[Path] = []

    def read_only(step: str, path: Path) -> None:
        if step == "stage":
            seen.append(path)
            if len(seen) == 2:
                raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(fsio, "fault_hook", read_only)
    fails(runner, site_059, ExitCode.TARGET, ["Read-only file system", "cannot write"])
    assert not list(site_059.rglob("*.sglpatch"))
    assert api.log(site_059).entries == []


def test_a_patched_file_replaced_by_a_directory(runner: CliRunner, site_059: Path) -> None:
    """Drift, not a crash: status says so, revert refuses, revert --force restores the rest."""
    assert api.apply(site_059, None).written
    (site_059 / KIMI).unlink()
    (site_059 / KIMI).mkdir()
    rows = {row.file: row for row in api.status(site_059).patches}
    assert rows[KIMI].state == "edited since applied"
    assert "no longer a regular file" in rows[KIMI].note
    result = runner.invoke(app, ["status", "--target", str(site_059)])
    assert result.exit_code == 0 and "no longer a regular file" in result.stdout
    fails(runner, site_059, ExitCode.REFUSED, [KIMI, "no longer a regular file"], "revert")
    result = runner.invoke(app, ["revert", "--force", "--target", str(site_059)])
    assert result.exit_code == 0, result.stderr
    assert f"left {KIMI}" in result.stdout
    pristine = wheels.site_packages(SEED, site_059.parent / "pristine", [SIZES])
    assert (site_059 / SIZES).read_bytes() == (pristine / SIZES).read_bytes()
    assert (site_059 / KIMI).is_dir()
    (site_059 / KIMI).rmdir()  # once it is gone, a forced revert recreates it
    assert runner.invoke(app, ["revert", "--force", "--target", str(site_059)]).exit_code == 0
    assert (site_059 / KIMI).read_bytes() == wheels.member(SEED, KIMI)
