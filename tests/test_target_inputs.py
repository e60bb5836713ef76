"""Reading a target's release from hostile input: a corrupt git checkout, version files that are
FIFOs or too deep to parse. Each is "release unknown" or the release, never a crash or a hang."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import reading
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.target import Layout, detect_release
from tests.support import wheels
from tests.support.releases import SEED

DEEP = "x = " + " + ".join(["a"] * 3000) + "\n"  # RecursionError in ast.parse


def one_line_error(stderr: str, *words: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglpatch: error: "), stderr
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def checkout(root: Path) -> Path:
    """A git checkout of the real 0.5.9 (python/sglang/), tagged v0.5.9, with no dist-info or
    `_version.py`: its release can only come from the tag."""
    site = wheels.site_packages(SEED, root / "python", wheels.patch_targets(SEED))
    for info in site.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    (site / "sglang" / "_version.py").unlink()
    git = ["git", "-C", str(root), "-c", "user.name=t", "-c", "user.email=t@example.com"]
    subprocess.run([*git, "init", "-q"], check=True)
    subprocess.run([*git, "commit", "-q", "--allow-empty", "-m", SEED], check=True)
    subprocess.run([*git, "tag", "v0.5.9"], check=True)
    return root


@pytest.mark.wheel
def test_a_corrupt_git_config_is_release_unknown_every_time(
    runner: CliRunner, tmp_path: Path
) -> None:
    """gitpython's `git cat-file` dies on the config and the request hits a closed pipe: that
    BrokenPipeError once escaped as exit 141 with nothing on stderr, in 3 runs of 5."""
    root = checkout(tmp_path / "sglang")
    assert str(detect_release(root, Layout.CHECKOUT)[0]) == SEED
    (root / ".git" / "config").write_text("[core\n\tbare = \x00zz\n[[[\n")
    for _ in range(10):
        assert detect_release(root, Layout.CHECKOUT) == (None, None)
    for _ in range(8):
        result = runner.invoke(app, ["status", "--check", "--target", str(root)])
        assert result.exit_code == ExitCode.USAGE, (result.exit_code, result.stderr)
        one_line_error(result.stderr, "cannot tell which SGLang release")


@pytest.mark.wheel
def test_doctor_on_a_checkout_whose_tag_is_broken_needs_a_release(
    runner: CliRunner, tmp_path: Path
) -> None:
    """It said "capability 12 (SGLang, release unknown): ready" and exit 0."""
    root = checkout(tmp_path / "sglang")
    (root / ".git" / "refs" / "tags" / "v0.5.9").write_text("1234" * 10 + "\n")  # no such object
    assert detect_release(root, Layout.CHECKOUT) == (None, None)
    result = runner.invoke(app, ["doctor", "--target", str(root)])
    assert result.exit_code == ExitCode.USAGE and result.stdout == ""
    one_line_error(result.stderr, "cannot tell which SGLang release", "--release")
    result = runner.invoke(app, ["doctor", "--target", str(root), "--release", SEED])
    assert result.exit_code == ExitCode.GAPS, result.stderr
    assert result.stdout.startswith("capability 12 (SGLang 0.5.9): ")


@pytest.mark.wheel
def test_a_version_file_too_deep_to_parse_is_release_unknown(
    runner: CliRunner, site_059: Path
) -> None:
    """A 3,000-term expression in `_version.py` made every command an internal error (70)."""
    for info in site_059.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    version_file = site_059 / "sglang" / "_version.py"
    version_file.write_text(version_file.read_text() + DEEP)
    result = runner.invoke(app, ["status", "--check", "--target", str(site_059)])
    assert result.exit_code == ExitCode.USAGE, result.stderr
    one_line_error(result.stderr, "cannot tell which SGLang release")
    result = runner.invoke(app, ["apply", "--target", str(site_059), "--release", SEED])
    assert result.exit_code == 0, result.stderr  # given, the release is used


@pytest.mark.wheel
@pytest.mark.parametrize("fifo", ["sglang/_version.py", "sglang-0.5.9.dist-info/METADATA"])
def test_a_version_file_that_is_a_fifo_does_not_hang(site_059: Path, fifo: str) -> None:
    """Opening a FIFO waits for a writer: every command hung before reading the release."""
    (site_059 / fifo).unlink()
    os.mkfifo(site_059 / fifo)
    try:
        done = subprocess.run(
            [sys.executable, "-m", "sglpatch", "status", "--target", str(site_059)],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"status waited on the FIFO {fifo}")
    # The release is still read from the other file (METADATA, or `_version.py`).
    assert done.returncode == 0, done.stderr
    assert SEED in done.stdout


def test_read_regular_refuses_what_is_not_a_regular_file(tmp_path: Path) -> None:
    fifo = tmp_path / "x.py"
    os.mkfifo(fifo)
    zero = tmp_path / "zero.py"
    zero.symlink_to(os.devnull if not Path("/dev/zero").exists() else "/dev/zero")
    for path in (fifo, zero, tmp_path):
        with pytest.raises(OSError, match="not a regular file") as error:
            reading.read_regular(path, 1 << 20)
        assert error.value.errno == errno.EINVAL
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * 5000)
    with pytest.raises(OSError, match="larger than 4096 bytes"):
        reading.read_regular(big, 4096)
    assert reading.read_regular(big, 4096, whole=False) == b"#" * 4096
    assert reading.read_regular(big, 5000) == b"#" * 5000
