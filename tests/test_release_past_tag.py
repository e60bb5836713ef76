"""A checkout past its release tag, and setuptools-scm's development versions: apply, status,
`status --check` and doctor settle on the same release (the tag's), as a new user's checkout
with one commit on top or an editable install's `_version.py` of `0.5.24.dev1+g…` needs.

Built from the real newest release's wheel, tagged as the sglang repository tags its releases.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.target import find_target
from tests.doctor.test_doctor_inputs import one_line_error
from tests.support.releases import NEWEST
from tests.test_target import git, make_checkout

pytestmark = pytest.mark.wheel

NEXT_DEV = "0.5.{}.dev1+g1234567".format(int(NEWEST.split(".")[-1]) + 1)  # after NEWEST


@pytest.fixture
def past_tag(tmp_path: Path) -> Path:
    """The newest release's checkout with one commit of the user's on top of its tag."""
    root = make_checkout(NEWEST, tmp_path / "sglang")
    (root / "python" / "sglang" / "local_change.py").write_text("x = 1\n")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "a local change")
    return root


def invoke(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_checkout_one_commit_past_its_tag_is_that_release(past_tag: Path) -> None:
    """It was "release unknown": apply needed --version, then status said "unknown"."""
    target = find_target(past_tag, None)
    assert str(target.release) == NEWEST
    assert target.release_source is not None
    assert target.release_source.startswith(f"git describe: v{NEWEST}-1-g")
    assert target.release_source.endswith("1 commit past the tag")


def test_apply_status_and_check_agree_past_the_tag(runner: CliRunner, past_tag: Path) -> None:
    """The README's entrypoint recipe (`status --check || exit 1`) refused every start."""
    code, _, err = invoke(runner, "apply", "--target", str(past_tag))
    assert code == 0, err
    warning = f"sglpatch: warning: taken as SGLang {NEWEST}, from git describe: v{NEWEST}-1-g"
    assert warning in err  # inferred, not read as such: said once, on stderr
    code, out, err = invoke(runner, "status", "--target", str(past_tag))
    assert code == 0, err
    assert f"release: {NEWEST} (from git describe: v{NEWEST}-1-g" in out
    assert "unknown" not in out
    assert "  applied " in out
    code, out, err = invoke(runner, "status", "--check", "--target", str(past_tag))
    assert code == 0, err
    assert out.startswith("ok: ") and f"on SGLang {NEWEST}" in out


def test_status_falls_back_to_the_ledgers_record(runner: CliRunner, past_tag: Path) -> None:
    """With no tag left to read, status asks the ledger which release apply was told."""
    git(past_tag, "tag", "-d", f"v{NEWEST}")
    code, _, err = invoke(runner, "apply", "--target", str(past_tag))
    assert code == ExitCode.USAGE and "pass --release" in err
    code, _, err = invoke(runner, "apply", "--target", str(past_tag), "--release", NEWEST)
    assert code == 0, err
    code, out, err = invoke(runner, "status", "--target", str(past_tag))
    assert code == 0, err
    assert f"release: {NEWEST} (from the ledger's record of the last apply)" in out
    assert "unknown" not in out
    code, out, err = invoke(runner, "status", "--check", "--target", str(past_tag))
    assert code == 0 and out.startswith("ok: "), err


def test_status_takes_the_release_as_apply_does(runner: CliRunner, past_tag: Path) -> None:
    git(past_tag, "tag", "-d", f"v{NEWEST}")
    code, out, err = invoke(runner, "status", "--target", str(past_tag), "--release", NEWEST)
    assert code == 0, err
    assert f"release: {NEWEST} (from --release)" in out
    code, _, err = invoke(runner, "status", "--check", "-t", str(past_tag), "-r", NEWEST)
    assert code == ExitCode.NOT_IN_PLACE and f"--release {NEWEST}" in err  # the command to run


def test_a_dev_version_is_the_release_it_follows_in_apply_and_doctor(
    runner: CliRunner, past_tag: Path
) -> None:
    """doctor said "1 blocker, fixed by `sglpatch apply`" where apply refused the release."""
    version_file = past_tag / "python" / "sglang" / "_version.py"
    version_file.write_text(f'__version__ = "{NEXT_DEV}"\n')
    code, _, err = invoke(runner, "apply", "--dry-run", "--target", str(past_tag))
    assert code == 0, err
    assert f"SGLang {NEWEST} at {past_tag}" in err
    assert f"{NEXT_DEV}, a development version after {NEWEST}" in err  # the warning
    code, out, err = invoke(runner, "doctor", "--json", "--target", str(past_tag))
    report = json.loads(out)
    assert report["release"] == NEWEST
    assert "--force" not in report["verdict"]
    code, out, err = invoke(runner, "doctor", "--target", str(past_tag))
    assert out.splitlines()[2].startswith(f"  judged as SGLang {NEWEST}, from {version_file}: ")
    git(past_tag, "tag", "-d", f"v{NEWEST}")  # no tag: setuptools-scm's count says the same
    target = find_target(past_tag, None)
    assert str(target.release) == NEWEST
    assert (
        target.release_source == f"{version_file}: {NEXT_DEV}, a development version after {NEWEST}"
    )


def test_an_untested_release_is_one_short_line_and_doctor_says_force(
    runner: CliRunner, past_tag: Path
) -> None:
    """It was one line of about 1,700 characters naming the tested range 23 times."""
    git(past_tag, "tag", "-d", f"v{NEWEST}")
    (past_tag / "python" / "sglang" / "_version.py").write_text('__version__ = "0.6.0.dev3"\n')
    code, _, err = invoke(runner, "apply", "--dry-run", "--target", str(past_tag))
    assert code == ExitCode.REFUSED
    line = one_line_error(err, "0.6.0.dev3", "--force")
    assert len(line) < 160, line
    assert line.count(f"<={NEWEST}") == 1, line
    code, out, _ = invoke(runner, "doctor", "--target", str(past_tag))
    assert code == ExitCode.GAPS
    assert out.splitlines()[0].endswith("fixed by `sglpatch apply --force`"), out.splitlines()[0]
    assert f"\nNext:\n  sglpatch apply --force --target {past_tag}\n" in out


def test_a_dev_checkout_without_git_on_path_is_not_an_internal_error(
    past_tag: Path, tmp_path: Path
) -> None:
    """A dev `_version.py` made every command import gitpython, which fails without git: status,
    `status --check`, doctor and apply were exit 70 (the README: status works without git)."""
    import os
    import subprocess
    import sys

    (past_tag / "python" / "sglang" / "_version.py").write_text(
        f"__version__ = version = {NEXT_DEV!r}\n"
    )
    bare = tmp_path / "no-git"
    bare.mkdir()
    env = {**os.environ, "PATH": str(bare)}
    for argv in (["status"], ["status", "--check"], ["apply", "--dry-run"]):
        done = subprocess.run(
            [sys.executable, "-m", "sglpatch", *argv, "--target", str(past_tag)],
            capture_output=True, text=True, timeout=120, env=env, check=False,
        )  # fmt: skip
        assert done.returncode in (0, 1), (argv, done.stderr)
        assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    status = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status", "--target", str(past_tag)],
        capture_output=True, text=True, timeout=120, env=env, check=False,
    )  # fmt: skip
    assert f"release: {NEWEST} (from " in status.stdout, status.stdout


@pytest.mark.parametrize(
    ("dev", "follows"),
    [
        ("0.5.10.post2.dev1+gabc1234", "0.5.10.post1"),  # one past the tag v0.5.10.post1
        ("0.5.24rc1.dev1", "0.5.24rc0"),
        ("0.5.24.dev1", "0.5.23"),
    ],
)
def test_a_dev_version_follows_the_tag_setuptools_scm_counted_from(dev: str, follows: str) -> None:
    """`0.5.10.post2.dev1` was read as following 0.5.9 (the last number of the release, less
    one): a 0.5.10.post1 tree got 0.5.9's patches, and an rc slipped past the untested check."""
    from packaging.version import Version

    from sglpatch.release import _release_before

    assert _release_before(Version(dev)) == Version(follows)


def test_a_stale_version_file_in_a_checkout_does_not_outvote_a_newer_tag(
    runner: CliRunner, past_tag: Path
) -> None:
    """An untracked `_version.py` left from an install of an older release was believed over
    `git describe`, with no warning: the checkout got the older release's patches."""
    (past_tag / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.5.9'\n")
    target = find_target(past_tag, None)
    assert str(target.release) == NEWEST
    assert target.release_source is not None and "_version.py says 0.5.9" in target.release_source
    code, _, err = invoke(runner, "apply", "--dry-run", "--target", str(past_tag))
    assert code == 0, err
    assert f"sglpatch: warning: taken as SGLang {NEWEST}" in err


def test_release_given_overrides_a_release_that_was_only_inferred(
    runner: CliRunner, past_tag: Path
) -> None:
    """A guess could not be corrected: `--release` was refused as disagreeing with it. A
    release read as such (a tag on HEAD, a dist-info) is still checked."""
    (past_tag / "python" / "sglang" / "_version.py").write_text(
        f"__version__ = version = {NEXT_DEV!r}\n"
    )
    target = find_target(past_tag, Version("0.5.22"))
    assert str(target.release) == "0.5.22"
    assert target.release_source is not None
    assert target.release_source.startswith("--release 0.5.22; the tree: ")
