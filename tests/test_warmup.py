"""doctor's codemods in a process forked as the CLI starts (`sglpatch.warmup`): the same
answer as running them here, nothing left behind, and the CLI's own run when it has none."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import catalogue, warmup
from sglpatch.cli import app
from sglpatch.doctor import coverage
from tests import wheels

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork") or (os.cpu_count() or 1) < 2, reason="no fork or no second core"
)
KIMI = "KimiK25ForConditionalGeneration"


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree("0.5.9", tmp_path_factory.mktemp("warmup") / "0.5.9")


@pytest.fixture
def stopped() -> Iterator[None]:
    yield
    warmup.stop()  # whatever a test left running


def test_the_warm_process_answers_what_the_checks_here_find(tree: Path, stopped: None) -> None:
    patches = catalogue.load()
    release = Version("0.5.9")
    warmup.start(["doctor"])
    assert warmup.running()
    warmup.submit(tree / "sglang", release, None)
    answer = warmup.checks(patches)
    assert not warmup.running()  # answered, then stopped and reaped
    here = coverage.check(tree / "sglang", release, patches)
    assert answer == here
    assert len(here) >= 9 and all(c.after for c in here)  # 0.5.9: nine files change


def test_a_dead_warm_process_leaves_the_checks_to_the_cli(tree: Path, stopped: None) -> None:
    warmup.start(["doctor"])
    assert warmup._worker is not None
    os.kill(warmup._worker.pid, signal.SIGKILL)
    warmup.submit(tree / "sglang", Version("0.5.9"), None)
    assert warmup.checks(catalogue.load()) is None
    assert not warmup.running()


def test_no_process_to_spare_is_no_error(monkeypatch: pytest.MonkeyPatch, stopped: None) -> None:
    def no_fork() -> int:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(list(Path("/proc/self/fd").iterdir()))
    monkeypatch.setattr(os, "fork", no_fork)
    warmup.start(["doctor"])
    assert not warmup.running()
    assert len(list(Path("/proc/self/fd").iterdir())) == before  # its pipes closed again


def test_doctor_with_stderr_closed_still_answers(tree: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(tree)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False,
        preexec_fn=lambda: os.close(2),
    )  # fmt: skip
    assert done.returncode == 5
    assert done.stdout.startswith("capability 12 (SGLang 0.5.9): ")


def test_only_doctor_starts_one(stopped: None) -> None:
    for args in ([], ["apply"], ["status", "doctor"], ["--help"]):
        warmup.start(args)
        assert not warmup.running(), args


@pytest.mark.parametrize("args", [[], ["--model", KIMI]])
def test_doctor_as_a_command_says_what_it_says_in_process(tree: Path, args: list[str]) -> None:
    """`python -m sglpatch doctor` (with the warm process) against the CLI run in-process."""
    command = ["doctor", "--target", str(tree), "--json", *args]
    started = subprocess.run(
        [sys.executable, "-m", "sglpatch", *command], capture_output=True, text=True, check=False
    )
    inside = CliRunner().invoke(app, command)
    assert started.returncode == inside.exit_code == 5, started.stderr
    assert json.loads(started.stdout) == json.loads(inside.stdout)


def test_the_warm_process_ends_with_a_cli_that_failed_early(tmp_path: Path) -> None:
    """A usage error comes before the job is sent: the process still ends with the CLI."""
    marker = tmp_path / "no-such-target-ab12cd"
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(marker)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode != 0 and done.stderr.count("\n") == 1, done.stderr
    deadline = time.monotonic() + 5
    while _processes_naming(str(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _processes_naming(str(marker)) == []


def _processes_naming(text: str) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                continue
    return found
