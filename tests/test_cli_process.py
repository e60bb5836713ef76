"""The CLI as a process on the real SGLang 0.5.9 wheel: what it imports, finding SGLang without
--target, help and version, closed pipes, Ctrl-C while it imports, crash logs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support import fifos, wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel


def run(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def _python(code: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    ).stdout


# libcst is imported on first use (sglpatch.lazy): its code has run only if its nodes are loaded.
# importlib.metadata is never loaded: sglpatch.entry_points reads the entry points itself.
HEAVY = ("libcst._nodes.module", "git", "importlib.metadata")


def test_the_cli_and_status_load_neither_libcst_nor_git(site_059: Path) -> None:
    loaded = json.loads(
        _python("import sys, json, sglpatch.cli; print(json.dumps(sorted(sys.modules)))")
    )
    assert not [m for m in HEAVY if m in loaded]
    code = (
        "import sys, json\n"
        "from sglpatch.cli import app\n"
        f"try:\n    app(['status', '--target', {str(site_059)!r}])\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    modules = json.loads(_python(code).splitlines()[-1])
    assert "sglpatch.patches.kimi_k25_eagle3_interface" in modules  # the catalogue was read
    assert not [m for m in HEAVY if m in modules]


def test_without_target_the_importable_sglang_is_found(site_059: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status"], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(site_059)}, check=True,
    ).stdout  # fmt: skip
    assert f"target:  {site_059} (site-packages)" in out

    # A pipx-style install: not importable here, but python3 on PATH sees it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nPYTHONPATH={site_059} exec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status"], capture_output=True, text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, check=True,
    ).stdout  # fmt: skip
    assert f"target:  {site_059} (site-packages)" in out


def test_nothing_found_without_target(runner: CliRunner) -> None:
    code, _, err = run(runner, "status")
    assert code == ExitCode.TARGET and "--target" in err


def test_help_and_version(runner: CliRunner) -> None:
    code, out, _ = run(runner, "--help")
    assert code == 0 and all(c in out for c in ("apply", "revert", "status", "log", "list"))
    code, out, _ = run(runner, "apply", "--help")
    assert code == 0 and "--dry-run" in out and "--target" in out and "--ledger" in out
    code, out, _ = run(runner, "--version")
    assert code == 0 and out.startswith("sglpatch ")


def test_a_closed_output_pipe_is_not_a_crash(site_059: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "apply", "--dry-run", "--target", str(site_059)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # like `| head` that has read enough
    err = process.stderr.read().decode()
    assert process.wait() == ExitCode.BROKEN_PIPE
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize("stdout", [">&-", ">/dev/full"])
def test_a_finished_apply_with_stdout_closed_or_full_exits_0(site_059: Path, stdout: str) -> None:
    """The change happened: that its report could not be printed is no failure."""
    command = f"{shlex.quote(sys.executable)} -m sglpatch apply --target {site_059} {stdout}"
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    states = {row.id: row.state for row in api.status(site_059).patches}
    assert states == wheels.expected_states(SEED, "applied")
    dry = command.replace(" apply ", " status ")
    assert subprocess.run(["sh", "-c", dry], check=False).returncode in (0, ExitCode.BROKEN_PIPE)


# Interrupts this process once, when libcst (loaded lazily, on the first parse) is half imported.
TRIP = """
import importlib.abc, os, signal, sys
class Trip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "libcst._batched_visitor":  # the first thing libcst imports
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Trip())
from sglpatch.cli import main
sys.argv = ["sglpatch", *sys.argv[1:]]
main()
"""


def test_ctrl_c_while_libcst_imports_is_an_interrupt(site_059: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRIP, "apply", "--dry-run", "--target", str(site_059)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == ExitCode.INTERRUPTED, result.stderr
    assert result.stderr.strip() == "sglpatch: error: interrupted"


# What the `sglpatch` console script does (load its entry point, call it), with Ctrl-C while
# the CLI itself (typer first) is importing.
TRIP_CLI = TRIP.replace("libcst._batched_visitor", "typer").replace(
    "from sglpatch.cli import main",
    "from importlib.metadata import entry_points\n"
    "(script,) = entry_points(group='console_scripts', name='sglpatch')\n"
    "main = script.load()",
)


def test_ctrl_c_while_the_cli_imports_is_an_interrupt(site_059: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRIP_CLI, "status", "--target", str(site_059)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == ExitCode.INTERRUPTED, result.stderr
    assert result.stderr.strip() == "sglpatch: error: interrupted"


def test_the_crash_log_goes_to_the_ledger_in_use(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ledger_dir: Path
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(api, "status", boom)
    code, _, err = run(runner, "status", "--ledger", str(tmp_path / "mine"))
    assert code == ExitCode.BUG
    assert f"details in {tmp_path / 'mine' / 'sglpatch-crash.log'}" in err
    assert "kaboom" in (tmp_path / "mine" / "sglpatch-crash.log").read_text()
    assert not (ledger_dir / "sglpatch-crash.log").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_crash_log_that_is_no_file_is_not_written(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    """A FIFO there made the error's report wait for a reader; a symbolic link (the log falls
    back to the shared TMPDIR) appended the traceback to the file it names."""

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(api, "status", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "mine").mkdir()
    log = tmp_path / "mine" / "sglpatch-crash.log"
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.mkfifo(log) if kind == "fifo" else log.symlink_to(victim)
    code, _, err = fifos.without_waiting(
        log, lambda: run(runner, "status", "--ledger", str(tmp_path / "mine"))
    )
    assert code == ExitCode.BUG
    assert f"details in {tmp_path / 'tmp' / 'sglpatch-crash.log'}" in err
    assert "kaboom" in (tmp_path / "tmp" / "sglpatch-crash.log").read_text()
    assert victim.read_text() == "mine\n"
