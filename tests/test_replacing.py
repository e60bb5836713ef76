"""Replacing target files: a concurrent edit, a file the user may not write, a file that cannot be
renamed over. In each case nothing changes, nothing is recorded, and the next run works."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api, errors, reading
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.store import fsio, journal
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"
CHANGED = wheels.applied_targets(SEED)
EDIT = b"# a user's edit\n"


def one_line_error(result: object, code: int, *words: str) -> str:
    stderr = getattr(result, "stderr", "")
    assert getattr(result, "exit_code", None) == code, (getattr(result, "stdout", ""), stderr)
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglpatch: error: "), stderr
    assert all(word in lines[0] for word in words), lines[0]
    return str(lines[0])


def nothing_recorded(site: Path) -> None:
    assert api.log(site).entries == []
    assert not list(site.rglob("*.sglpatch"))
    assert all(row.state != "applied" for row in api.status(site).patches)


@pytest.mark.parametrize("when", ["journal", "stage", "replace"])
def test_an_edit_while_apply_runs_is_never_lost(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch, when: str
) -> None:
    """The issue's repro: a file edited after apply read it. Edited at the journal step (the
    plan is made), while files are staged, or as the renames go (the second file, just before
    its rename: the first, already renamed, must get its old bytes back)."""
    seen: list[Path] = []
    victims: list[Path] = []

    def edit(step: str, path: Path) -> None:
        if step != when:
            return
        seen.append(path)
        if len(seen) == (2 if when == "replace" else 1):
            victims.append(path if when == "replace" else site_059 / KIMI)
            with victims[0].open("ab") as handle:
                handle.write(EDIT)

    pristine = snapshot(site_059)
    monkeypatch.setattr(fsio, "fault_hook", edit)
    result = runner.invoke(app, ["apply", "--target", str(site_059)])
    (edited,) = victims
    member = str(edited.relative_to(site_059))
    one_line_error(result, ExitCode.REFUSED, member, "changed while sglpatch was running", "again")
    assert snapshot(site_059) == {**pristine, member: pristine[member] + EDIT}
    nothing_recorded(site_059)

    monkeypatch.setattr(fsio, "fault_hook", None)  # run again: the edit is what gets patched
    assert runner.invoke(app, ["apply", "--target", str(site_059)]).exit_code == 0
    assert runner.invoke(app, ["revert", "--target", str(site_059)]).exit_code == 0
    assert edited.read_bytes() == pristine[member] + EDIT


def test_an_edit_while_revert_runs_is_never_lost(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert api.apply(site_059, None).written
    patched = snapshot(site_059)
    edited = site_059 / KIMI

    def edit(step: str, path: Path) -> None:
        if step == "journal":
            with edited.open("ab") as handle:
                handle.write(EDIT)

    monkeypatch.setattr(fsio, "fault_hook", edit)
    result = runner.invoke(app, ["revert", "--target", str(site_059)])
    one_line_error(result, ExitCode.REFUSED, KIMI, "changed while sglpatch was running")
    assert edited.read_bytes() == patched[KIMI] + EDIT
    for member, data in patched.items():
        if member != KIMI:
            assert (site_059 / member).read_bytes() == data, member
    assert len(api.log(site_059).entries) == 1  # only the apply


def test_an_edit_during_a_real_apply_process(site_059: Path, tmp_path: Path) -> None:
    """As the issue ran it: a separate apply process, and the user's edit inside its window
    (here, between reading the files and replacing them: at its journal step)."""
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, pathlib\n"
        "from sglpatch.store import fsio\n"
        "from sglpatch.cli import main\n"
        f"kimi = pathlib.Path({str(site_059 / KIMI)!r})\n"
        "def hook(step, path):\n"
        "    if step == 'journal':\n"
        f"        kimi.write_bytes(kimi.read_bytes() + {EDIT!r})\n"
        "fsio.fault_hook = hook\n"
        "sys.argv = ['sglpatch', 'apply', '--target', sys.argv[1]]\n"
        "main()\n"
    )
    before = snapshot(site_059)
    run = subprocess.run(
        [sys.executable, str(driver), str(site_059)], capture_output=True, text=True, check=False
    )
    assert run.returncode == ExitCode.REFUSED, run.stderr
    assert "changed while sglpatch was running" in run.stderr
    after = snapshot(site_059)
    assert after[KIMI] == before[KIMI] + EDIT
    assert {k: v for k, v in after.items() if k != KIMI} == {
        k: v for k, v in before.items() if k != KIMI
    }


@pytest.fixture
def immutable(site_059: Path) -> Iterator[Path]:
    """The fourth file apply changes, made immutable (chattr +i), as some images ship files."""
    path = site_059 / CHANGED[3]
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(path)], check=False).returncode:
        pytest.skip("chattr +i is not available on this filesystem")
    try:
        yield path
    finally:
        subprocess.run([chattr, "-i", str(path)], check=False)


def test_an_immutable_file_stops_apply_before_any_rename(
    runner: CliRunner, site_059: Path, immutable: Path
) -> None:
    before = snapshot(site_059)
    result = runner.invoke(app, ["apply", "--target", str(site_059)])
    one_line_error(result, ExitCode.TARGET, str(immutable), "nothing was changed")
    assert snapshot(site_059) == before
    nothing_recorded(site_059)
    assert api.status(site_059).interrupted is None


def test_a_rename_that_fails_midway_is_undone(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A rename that fails though the checks passed (EBUSY from a bind mount they could not
    see): the files renamed before it get their old bytes back; no commit, no journal."""
    before = snapshot(site_059)
    renames: list[Path] = []
    real = Path.replace

    def busy_fourth(self: Path, target: str | os.PathLike[str]) -> Path:
        if self.name.endswith(fsio.STAGE_SUFFIX):
            renames.append(Path(target))
            if len(renames) == 4:
                raise OSError(16, "Device or resource busy")
        return real(self, target)

    monkeypatch.setattr(Path, "replace", busy_fourth)
    result = runner.invoke(app, ["apply", "--target", str(site_059)])
    one_line_error(result, ExitCode.TARGET, str(renames[3]), "Device or resource busy")
    assert snapshot(site_059) == before
    nothing_recorded(site_059)
    assert api.status(site_059).interrupted is None

    # And revert is not blocked by anything: apply, then fail a revert the same way.
    monkeypatch.setattr(Path, "replace", real)
    assert api.apply(site_059, None).written
    patched = snapshot(site_059)
    renames.clear()
    monkeypatch.setattr(Path, "replace", busy_fourth)
    result = runner.invoke(app, ["revert", "--target", str(site_059)])
    one_line_error(result, ExitCode.TARGET, "Device or resource busy", "nothing was changed")
    assert snapshot(site_059) == patched
    monkeypatch.setattr(Path, "replace", real)
    assert runner.invoke(app, ["revert", "--target", str(site_059)]).exit_code == 0
    assert snapshot(site_059) == before


def test_a_bind_mounted_file_is_refused_before_any_rename(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    target = site_059 / CHANGED[2]
    source = tmp_path / "elsewhere.py"
    source.write_bytes(target.read_bytes())
    if (
        os.geteuid() != 0
        or subprocess.run(
            ["mount", "--bind", str(source), str(target)], capture_output=True, check=False
        ).returncode
    ):
        pytest.skip("mount --bind needs root and a mount namespace that allows it")
    try:
        before = snapshot(site_059)
        result = runner.invoke(app, ["apply", "--target", str(site_059)])
        one_line_error(result, ExitCode.TARGET, str(target), "mount point")
        assert snapshot(site_059) == before
        nothing_recorded(site_059)
    finally:
        subprocess.run(["umount", str(target)], check=False)


def test_a_journal_that_cannot_be_finished_never_blocks_revert(
    site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An apply killed after some renames, then a file that can no longer be replaced: apply
    cannot finish the journal (exit 3, nothing changed), revert undoes it and reverts."""
    pristine = snapshot(site_059)
    kills = iter(range(100))

    def killed_at_third_rename(step: str, path: Path) -> None:
        if step == "replace" and next(kills) == 2:
            raise SystemExit("killed")  # stands in for SIGKILL: the journal stays

    with pytest.MonkeyPatch.context() as killed:
        killed.setattr(fsio, "fault_hook", killed_at_third_rename)
        killed.setattr(fsio.Staged, "restore", lambda self: False)  # a kill undoes nothing
        with pytest.raises(fsio.ReplaceFailed, match="the next run finishes the change"):
            api.apply(site_059, None)
    assert api.status(site_059).interrupted == "apply"
    half = snapshot(site_059)
    assert half != pristine

    stuck = site_059 / next(m for m in CHANGED if half[m] == pristine[m])
    monkeypatch.setattr(fsio, "replace_problem", lambda p, mounts: "stuck" if p == stuck else None)
    with pytest.raises(errors.TargetError, match="stuck"):
        api.apply(site_059, None)
    assert snapshot(site_059) == half  # the replay changed nothing either

    report = api.revert(site_059)
    assert report.restored == ()  # nothing was ever committed: the undo did it all
    assert snapshot(site_059) == pristine
    assert api.status(site_059).interrupted is None
    assert api.log(site_059).entries == []


def test_a_file_owned_by_someone_else_is_refused(
    runner: CliRunner, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Run as an ordinary user (a stand-in euid) on a tree whose file is root's: refused before
    anything is written, since a rename would make the file the user's for good."""
    owner = site_059 / CHANGED[1]
    assert owner.stat().st_uid == 0 or os.geteuid() != 0
    monkeypatch.setattr(os, "geteuid", lambda: 4242)
    monkeypatch.setattr(os, "access", lambda path, mode, **_: True)  # the folder is writable
    before = snapshot(site_059)
    result = runner.invoke(app, ["apply", "--target", str(site_059)])
    one_line_error(result, ExitCode.TARGET, "owned by root", "run sglpatch as root")
    assert snapshot(site_059) == before
    nothing_recorded(site_059)


NOBODY = 65534


def _as_nobody(argv: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """sglpatch under the system's Python as `nobody`, with this interpreter's packages."""
    paths = [p for p in sys.path if p and Path(p).is_dir()]
    code = (
        "import os, site, sys\n"
        "for p in os.environ['TEST_SITE'].split(os.pathsep): site.addsitedir(p)\n"
        "from sglpatch.cli import main\n"
        "sys.argv = ['sglpatch', *sys.argv[1:]]\n"
        "main()\n"
    )
    return subprocess.run(
        ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups",
         "/usr/bin/python3", "-c", code, *argv],
        capture_output=True, text=True, check=False,
        env={**env, "TEST_SITE": os.pathsep.join(paths)},
    )  # fmt: skip


def test_as_an_ordinary_user_a_root_owned_file_is_refused(tmp_path: Path) -> None:
    """The real thing where this machine allows it: sglpatch run as `nobody` on a tree in a
    folder nobody may write, holding a file root owns (mode 0644)."""
    if os.geteuid() != 0 or not shutil.which("setpriv") or not Path("/usr/bin/python3").exists():
        pytest.skip("needs root (to become nobody), setpriv and /usr/bin/python3")
    import tempfile

    top = Path(tempfile.mkdtemp(prefix="sglpatch-nobody-"))  # /tmp: nobody can reach it
    try:
        top.chmod(0o777)
        site = wheels.site_packages(SEED, top / "site", wheels.patch_targets(SEED))
        for path in [top, *top.rglob("*")]:
            os.chown(path, NOBODY, NOBODY)
        owned = site / CHANGED[1]
        os.chown(owned, 0, 0)
        owned.chmod(0o644)
        env = {"PATH": os.environ["PATH"], "HOME": str(top), "GIT_CONFIG_NOSYSTEM": "1"}
        probe = _as_nobody(["--version"], env)
        if probe.returncode != 0:
            pytest.skip(f"nobody cannot run this interpreter's packages: {probe.stderr[-200:]}")
        before = snapshot(site)
        run = _as_nobody(["apply", "--target", str(site)], env)
        assert run.returncode == ExitCode.TARGET, run.stderr
        assert str(owned) in run.stderr and "owned by root" in run.stderr
        assert snapshot(site) == before
        assert owned.stat().st_uid == 0
        assert not (top / ".local" / "state" / "sglpatch" / "pending").exists() or not list(
            (top / ".local" / "state" / "sglpatch" / "pending").iterdir()
        )
    finally:
        shutil.rmtree(top, ignore_errors=True)


def test_replace_problem_reads_the_kernel_answers(tmp_path: Path) -> None:
    """The pre-flight itself: fine for an ordinary file; a FIFO's bytes are never waited for."""
    ordinary = tmp_path / "a.py"
    ordinary.write_bytes(b"x = 1\n")
    assert fsio.replace_problem(ordinary, frozenset()) is None
    assert fsio.replace_problem(tmp_path / "new.py", frozenset()) is None
    assert "mount point" in str(fsio.replace_problem(ordinary, frozenset([str(ordinary)])))
    fifo = tmp_path / "f.py"
    os.mkfifo(fifo)
    assert journal.current(fifo) == ""  # not a regular file, answered at once
    with pytest.raises(reading.NotRegularFile):
        reading.read_regular(fifo)
