"""Output that cannot be written: a typed error from the guarded stdout, never a guess.

While a command runs, stdout is guarded: a write or flush failing with the errno of an output
that takes no more (ENOSPC, EDQUOT, EIO, EFBIG, EBADF) raises `StdoutUnwritable`, which the
handler ends quietly on (0 once a change is on disk, 141 before). The same errno from anything
else stays what it was: an internal error, with the crash log.
"""

from __future__ import annotations

import errno
import io
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch.cli import errors
from sglpatch.errors import ExitCode, StdoutUnwritable

REPO = Path(__file__).resolve().parent.parent

# The CLI with one api function's body replaced by `body`.
SCRIPT = """
import errno, sys
from sglpatch import api
def replaced(*args, **kwargs):
    {body}
api.{function} = replaced
from sglpatch.cli import main
sys.argv = ["sglpatch", *sys.argv[1:]]
main()
"""


def shell(line: str, **env: str) -> subprocess.CompletedProcess[str]:
    """`line` run by sh (for its redirections), `sglpatch` standing for this Python's CLI."""
    command = line.replace("sglpatch", f"{shlex.quote(sys.executable)} -m sglpatch", 1)
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, **env},
    )  # fmt: skip


def scripted(function: str, body: str, *args: str, stdout: str) -> subprocess.CompletedProcess[str]:
    script = shlex.quote(SCRIPT.format(function=function, body=body))
    words = " ".join(shlex.quote(a) for a in args)
    return subprocess.run(
        ["sh", "-c", f"{shlex.quote(sys.executable)} -c {script} {words} {stdout}"],
        capture_output=True, text=True, cwd=REPO, check=False,
    )  # fmt: skip


class Failing(io.StringIO):
    """A text stream whose every write or flush fails with `code`."""

    def __init__(self, code: int) -> None:
        super().__init__()
        self.code = code

    def write(self, text: str) -> int:
        raise OSError(self.code, os.strerror(self.code))

    def flush(self) -> None:
        raise OSError(self.code, os.strerror(self.code))


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EFBIG, errno.EBADF])
def test_an_output_errno_from_stdout_is_typed(code: int) -> None:
    guarded = errors._GuardedOutput(Failing(code))
    for call in (lambda: guarded.write("x"), guarded.flush):
        with pytest.raises(StdoutUnwritable) as caught:
            call()
        assert isinstance(caught.value, OSError) and caught.value.errno == code


def test_other_errors_from_stdout_pass_unchanged() -> None:
    with pytest.raises(BrokenPipeError):  # 141 only when stdout's reader left: polled apart
        errors._GuardedOutput(Failing(errno.EPIPE)).write("x")
    with pytest.raises(OSError) as caught:
        errors._GuardedOutput(Failing(errno.EACCES)).flush()
    assert type(caught.value) is PermissionError
    with pytest.raises(TypeError):  # click probes a stream for bytes with write(b"")
        errors._GuardedOutput(io.StringIO()).write(b"")


def test_the_guard_is_the_stream_otherwise() -> None:
    stream = io.TextIOWrapper(io.BytesIO(), encoding="utf-8")
    guarded = errors._GuardedOutput(stream)
    assert guarded.write("héllo") == 5
    guarded.flush()
    assert (guarded.encoding, guarded.isatty()) == ("utf-8", False)
    assert stream.buffer.getvalue() == "héllo".encode()  # type: ignore[attr-defined]
    assert isinstance(guarded.buffer, errors._GuardedOutput)  # click's bytes go there
    assert guarded.buffer.stream is stream.buffer


def test_stdout_is_guarded_only_while_a_command_runs() -> None:
    seen = []

    @errors.handled
    def command() -> None:
        seen.append(sys.stdout)

    before = sys.stdout
    command()
    assert isinstance(seen[0], errors._GuardedOutput) and seen[0].stream is before
    assert sys.stdout is before


def test_enospc_from_anything_but_stdout_is_an_internal_error(tmp_path: Path) -> None:
    """The ledger's disk filling up is no unwritable stdout: not a quiet 141, even when stdout
    is full too."""
    ledger = tmp_path / "ledger"
    body = "raise OSError(errno.ENOSPC, 'No space left on device')"
    args = ("status", "--check", "--target", str(tmp_path), "--ledger", str(ledger))
    for stdout in ("", ">/dev/full"):
        result = scripted("check", body, *args, stdout=stdout)
        assert result.returncode == ExitCode.BUG, result.stderr
        assert "internal error: OSError: [Errno 28] No space left on device" in result.stderr
        assert "Traceback" not in result.stderr
    assert "No space left on device" in (ledger / "sglpatch-crash.log").read_text()


@pytest.mark.parametrize(
    ("stdout", "env"),
    [(">/dev/full", {}), ("1</dev/null", {}), (">/dev/full", {"PYTHONIOENCODING": "ascii"})],
    ids=["full", "read-only-descriptor", "full-ascii"],
)
def test_unwritable_stdout_before_any_change_is_141(stdout: str, env: dict[str, str]) -> None:
    result = shell(f"sglpatch list {stdout}", **env)
    assert (result.returncode, result.stderr) == (ExitCode.BROKEN_PIPE, "")


@pytest.mark.wheel
def test_unwritable_stdout_after_the_change_is_0(site_059: Path) -> None:
    """A descriptor open for reading only (EBADF) once the patches are on disk: done is done."""
    target = shlex.quote(str(site_059))
    result = shell(f"sglpatch apply --target {target} 1</dev/null")
    assert (result.returncode, result.stderr) == (ExitCode.OK, "")
    status = shell(f"sglpatch status --check --target {target}")
    assert status.returncode == ExitCode.OK, status.stdout + status.stderr
