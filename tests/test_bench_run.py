"""bench/run on bad input or killed: one line, an exit code, no scratch folder left behind.

Every bad value is refused before a wheel is read, so these tests need no wheels and no network
(a failed download is simulated with pip's own `PIP_NO_INDEX`), except the one marked `wheel`
that kills a real bench run while it fills its padded tree.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.refusals import assert_refused, run_script
from tests.support.releases import SEED

BENCH = wheels.REPO / "bench" / "run"
BENCH_PROG = "bench/run"


@pytest.fixture
def scratch(tmp_path: Path) -> Path:
    """bench/run's TMPDIR: its scratch folder (`sglpatch-bench-*`) is made in here."""
    path = tmp_path / "tmp"
    path.mkdir()
    return path


def _stub(tmp_path: Path, name: str, body: str) -> Path:
    """A stand-in for `--python`: a shell script."""
    path = tmp_path / name
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)
    return path


@pytest.mark.parametrize(
    ("kind", "words"),
    [
        ("missing", ["no such file"]),
        ("not executable", ["not executable"]),
        ("a folder", ["a folder"]),
        ("no sglpatch", ["cannot list", "No module named sglpatch"]),
    ],
)
def test_bench_refuses_a_bad_python_in_one_line(
    tmp_path: Path, scratch: Path, kind: str, words: list[str]
) -> None:
    python = {
        "missing": tmp_path / "no-python",
        "not executable": tmp_path / "python",
        "a folder": tmp_path,
        "no sglpatch": _stub(tmp_path, "python3", "echo 'No module named sglpatch' >&2; exit 1"),
    }[kind]
    if kind == "not executable":
        python.write_text("#!/bin/sh\n")
    done = run_script(BENCH, ["--python", str(python)], {"TMPDIR": str(scratch)})
    assert_refused(done, BENCH_PROG, 2, "--python", str(python), *words)
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("rounds", ["x", "0", "-3"])
def test_bench_refuses_bad_rounds_in_one_line(scratch: Path, rounds: str) -> None:
    done = run_script(BENCH, ["--rounds", rounds], {"TMPDIR": str(scratch)})
    assert_refused(done, BENCH_PROG, 2, "--rounds")
    assert list(scratch.iterdir()) == []


def test_bench_removes_its_scratch_folder_when_a_download_fails(
    tmp_path: Path, scratch: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    listing = _stub(tmp_path, "python3", "echo sglang/srt/layers/x.py")  # lists, then is never used
    env = {
        "TMPDIR": str(scratch),
        "SGLPATCH_WHEEL_CACHE": str(empty),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    done = run_script(BENCH, ["--python", str(listing)], env)
    assert_refused(done, BENCH_PROG, 1, "pip download", "sglang==0.5.9", "No matching distribution")
    assert list(scratch.iterdir()) == []


def _default_signals() -> None:
    # A test runner started in the background ignores SIGINT, and a child inherits that.
    for signum in (signal.SIGINT, signal.SIGHUP):
        signal.signal(signum, signal.SIG_DFL)


@pytest.fixture
def bench_process() -> Iterator[list[subprocess.Popen[str]]]:
    """Started bench processes, killed at the end whatever the test found."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for process in started:
        if process.poll() is None:
            process.kill()
            process.wait()


def _start_bench(
    started: list[subprocess.Popen[str]], args: Sequence[str], env: dict[str, str]
) -> subprocess.Popen[str]:
    process = subprocess.Popen(
        [sys.executable, str(BENCH), *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
        preexec_fn=_default_signals,
    )
    started.append(process)
    return process


def _wait_for(
    process: subprocess.Popen[str], found: Callable[[], Path | None], timeout: float
) -> Path:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if (path := found()) is not None:
            return path
        assert process.poll() is None, process.communicate()
        time.sleep(0.02)
    pytest.fail(f"bench/run made no scratch folder in {timeout} s")


def _folder(scratch: Path, inside: str = "") -> Callable[[], Path | None]:
    def found() -> Path | None:
        for folder in scratch.glob("sglpatch-bench-*"):
            if (folder / inside).exists():
                return folder
        return None

    return found


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP])
def test_bench_removes_its_scratch_folder_when_it_is_killed(
    tmp_path: Path, scratch: Path, bench_process: list[subprocess.Popen[str]], signum: int
) -> None:
    """Killed while it waits for a child (here a `--python` that hangs): folder gone, 128 + N."""
    hanging = _stub(tmp_path, "python3", "exec sleep 60")
    process = _start_bench(bench_process, ["--python", str(hanging)], {"TMPDIR": str(scratch)})
    folder = _wait_for(process, _folder(scratch), timeout=20)
    time.sleep(0.2)  # into the child's run
    process.send_signal(signum)
    _, err = process.communicate(timeout=20)
    assert process.returncode == 128 + signum, err
    assert not folder.exists()
    assert list(scratch.iterdir()) == []
    assert "Traceback" not in err
    assert err.splitlines() == [f"{BENCH_PROG}: interrupted by {signal.Signals(signum).name}"]


@pytest.mark.wheel
def test_bench_killed_while_it_fills_the_padded_tree_leaves_nothing(
    scratch: Path, bench_process: list[subprocess.Popen[str]]
) -> None:
    """The report's case: SIGTERM while tens of thousands of files are being written."""
    wheels.wheel(SEED)
    env = {"TMPDIR": str(scratch), "SGLPATCH_WHEEL_CACHE": str(wheels.CACHE)}
    process = _start_bench(bench_process, ["--rounds", "7"], env)
    folder = _wait_for(process, _folder(scratch, "padded/sglang/srt/pad001"), timeout=60)
    process.send_signal(signal.SIGTERM)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 143, err
    assert not folder.exists()
    assert list(scratch.iterdir()) == []
    assert err.splitlines() == [f"{BENCH_PROG}: interrupted by SIGTERM"]
