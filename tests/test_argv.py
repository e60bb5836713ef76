"""The command line's error handler, whatever the bytes on the command line: one line, a code.

Python keeps the bytes of an argument that are not UTF-8 as lone surrogates (`\\udcff`): a text
option holding them is a usage error naming the option, and the crash log still gets written
(never a traceback instead of the one line). A BrokenPipeError means 141 only when it is stdout
that closed; one from another pipe (to git) is an internal error.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

REPO = Path(__file__).resolve().parent.parent

# The CLI with one api function's body replaced by `body` (a `raise`: an internal error on demand).
SCRIPT = """
import errno, sys
from sglpatch import api
def boom(*args, **kwargs):
    {body}
api.{function} = boom
from sglpatch.cli import main
sys.argv = ["sglpatch", *sys.argv[1:]]
main()
"""


def sglpatch(
    *args: str | bytes, function: str | None = None, body: str = "", **env: str
) -> subprocess.CompletedProcess[str]:
    prefix = ["-c", SCRIPT.format(function=function, body=body)] if function else ["-m", "sglpatch"]
    return subprocess.run(
        [sys.executable, *prefix, *args], capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, **env}, errors="backslashreplace",
    )  # fmt: skip


def one_line(stderr: str) -> str:
    assert "Traceback" not in stderr, stderr
    (line,) = stderr.splitlines()
    assert line.startswith("sglpatch: error: "), line
    return line


@pytest.mark.wheel
def test_a_model_that_is_not_utf8_is_a_usage_error(tmp_path: Path) -> None:
    tree = wheels.full_tree(SEED, tmp_path / "site-packages")
    result = sglpatch("doctor", "--target", str(tree), "--model", b"\xff\xfe")
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert one_line(result.stderr) == "sglpatch: error: --model '\\xff\\xfe' is not UTF-8 text"


@pytest.mark.parametrize(
    "args",
    [
        ["apply", "--only", b"sm120-symm-mem-sizes,\xff"],
        ["apply", "--release", b"0.5.\xff"],
        ["doctor", "--version", b"0.5.\xff"],
        ["list", "--release", b"0.5.\xff"],
    ],
    ids=["--only", "apply --release", "doctor --version", "list --release"],
)
def test_every_text_option_refuses_bytes_that_are_not_utf8(args: list[str | bytes]) -> None:
    result = sglpatch(*args)
    assert result.returncode == ExitCode.USAGE, result.stderr
    flag = str(args[1])
    assert f"{flag} '" in one_line(result.stderr) and "is not UTF-8 text" in result.stderr


def test_a_path_that_is_not_utf8_is_still_a_path(tmp_path: Path) -> None:
    result = sglpatch("status", "--target", os.fsencode(tmp_path) + b"/gone-\xff")
    assert result.returncode == ExitCode.TARGET, result.stderr
    assert "gone-\\xff: no such file or directory" in one_line(result.stderr)


@pytest.mark.parametrize("writable", [True, False], ids=["ledger", "no writable folder"])
def test_an_internal_error_with_undecodable_arguments_is_one_line(
    tmp_path: Path, writable: bool
) -> None:
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    ledger = tmp_path / "ledger" if writable else blocked / "ledger"
    result = sglpatch(
        "status", "--ledger", str(ledger), "--target", os.fsencode(tmp_path) + b"/\xff\xfe",
        function="status", body="raise RuntimeError('a bug')", TMPDIR=str(blocked),
    )  # fmt: skip
    assert result.returncode == ExitCode.BUG, result.stderr
    line = one_line(result.stderr)
    assert line.startswith("sglpatch: error: internal error: RuntimeError: a bug (details in ")
    if not writable:
        assert line.endswith("(details in nowhere: no writable folder)")
        return
    log = (ledger / "sglpatch-crash.log").read_text(encoding="utf-8")
    assert "\\udcff\\udcfe" in log and "RuntimeError: a bug" in log


PLUGIN = '''"""A plugin whose codemod has a bug."""

from packaging.specifiers import SpecifierSet

from sglpatch.patch import Patch


class Buggy(Patch):
    """Raises in transform."""

    id = "buggy"
    description = "has a bug"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release):
        return "srt/models/kimi_k25.py"

    def transform(self, module, release):
        raise ValueError("the plugin's bug")

    def postcondition(self, module, release):
        pass
'''


@pytest.mark.wheel
def test_a_plugin_in_a_folder_that_is_not_utf8_is_named_in_one_line(
    site_059: Path, tmp_path: Path
) -> None:
    folder = os.fsencode(tmp_path) + b"/patches-\xff"
    Path(os.fsdecode(folder)).mkdir()
    Path(os.fsdecode(folder), "buggy.py").write_text(PLUGIN)
    ledger = tmp_path / "ledger"
    result = sglpatch(
        "status", "--check", "--target", str(site_059), "--ledger", str(ledger), "--catalog", folder
    )
    assert result.returncode == ExitCode.TARGET, result.stderr
    line = one_line(result.stderr)
    assert "patch buggy from " in line and "patches-\\xff raised ValueError" in line
    log = (ledger / "sglpatch-crash.log").read_text(encoding="utf-8")
    assert "patches-\\udcff" in log and "the plugin's bug" in log


def test_a_broken_pipe_to_another_process_is_an_internal_error(tmp_path: Path) -> None:
    """gitpython's pipe to `git cat-file` broke; stdout is fine: not 141, and not silent."""
    result = sglpatch(
        "status", "--check", "--target", str(tmp_path), "--ledger", str(tmp_path / "ledger"),
        function="check", body="raise BrokenPipeError(errno.EPIPE, 'Broken pipe')",
    )  # fmt: skip
    assert result.returncode == ExitCode.BUG, result.stderr
    line = one_line(result.stderr)
    assert "internal error: BrokenPipeError: [Errno 32] Broken pipe (details in " in line
    assert "BrokenPipeError" in (tmp_path / "ledger" / "sglpatch-crash.log").read_text()


def test_a_closed_stdout_is_still_141(tmp_path: Path) -> None:
    """The reader went away (`| head`): that pipe's BrokenPipeError is the quiet 141."""
    script = SCRIPT.format(function="check", body="while True: print('x' * 65536, flush=True)")
    process = subprocess.Popen(
        [sys.executable, "-c", script, "status", "--check", "--target", str(tmp_path)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=REPO,
    )  # fmt: skip
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()
    err = process.stderr.read().decode()
    assert process.wait() == ExitCode.BROKEN_PIPE, err
    assert err == ""


def test_sys_exit_in_sglpatch_itself_is_an_internal_error(tmp_path: Path) -> None:
    """No command ends by sys.exit: one that escapes (a built-in patch's) is a bug, never 0."""
    result = sglpatch(
        "status", "--check", "--target", str(tmp_path), "--ledger", str(tmp_path / "ledger"),
        function="check", body="raise SystemExit(0)",
    )  # fmt: skip
    assert result.returncode == ExitCode.BUG, result.stderr
    assert "internal error: SystemExit: 0 (details in " in one_line(result.stderr)
