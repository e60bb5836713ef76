"""doctor's worker processes (`sglpatch.doctor.read.pool`): the same answer as running the work here,
nothing left behind, the caller's own run when a worker dies or no process can start, and in
one process on one core or a small tree."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import catalogue
from sglpatch.cli import app
from sglpatch.doctor import coverage
from sglpatch.doctor.read import pool
from tests.support import wheels
from tests.support.releases import SEED

KIMI = "KimiK25ForConditionalGeneration"
needs_pool = pytest.mark.skipif(pool.usable_cores() < 2, reason="one core: no pool")


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree(SEED, tmp_path_factory.mktemp("pool") / SEED)


@pytest.mark.wheel
@needs_pool
def test_a_worker_answers_what_the_checks_here_find(tree: Path) -> None:
    patches = catalogue.load()
    release = Version(SEED)
    with pool.Pool() as workers:
        assert workers.start(pool.SMALL)
        assert workers.executor is not None
        task = workers.run(coverage.check, tree / "sglang", release, patches)
        processes = list(workers.executor._processes.values())
        answer = task.result()
        assert task.future is None  # answered: a worker's result is taken once
    assert not any(p.is_alive() for p in processes)  # ended with the pool, and reaped
    here = coverage.check(tree / "sglang", release, patches)
    assert [(c.patch.id, c.file, c.outcome, c.after) for c in answer] == [
        (c.patch.id, c.file, c.outcome, c.after) for c in here
    ]
    assert len(here) >= 9 and all(c.after for c in here)  # 0.5.9: nine files change


@needs_pool
def test_finished_workers_end_while_the_caller_goes_on_and_are_reaped_at_close() -> None:
    with pool.Pool() as workers:
        assert workers.start(pool.SMALL) and workers.executor is not None
        assert workers.run(len, "abc").result() == 3
        processes = list(workers.executor._processes.values())
        workers.finish()
        assert workers.run(len, "here").result() == 4  # no more workers: run here
    assert processes and not any(p.is_alive() for p in processes)
    assert workers.executor is None


@pytest.mark.wheel
@needs_pool
def test_a_dead_worker_leaves_the_task_to_the_caller(tree: Path) -> None:
    with pool.Pool() as workers:
        assert workers.start(pool.SMALL) and workers.executor is not None
        task = workers.run(time.sleep, 3600)  # never ends in the worker
        for process in workers.executor._processes.values():
            os.kill(process.pid, signal.SIGKILL)
        task.fn, task.args = len, ("here",)  # what the caller then runs itself
        assert task.result() == 4


@pytest.mark.wheel
@needs_pool
def test_an_error_in_a_worker_is_raised_here(tree: Path) -> None:
    with pool.Pool() as workers:
        assert workers.start(pool.SMALL)
        task = workers.run(int, "not a number")
        with pytest.raises(ValueError, match="not a number"):
            task.result()


def test_no_process_to_spare_is_no_error(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_process(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    before = len(list(Path("/proc/self/fd").iterdir()))
    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_process)
    with pool.Pool() as workers:
        assert not workers.start(10 * pool.SMALL)
        assert workers.run(len, "here").result() == 4  # run by the caller
    assert len(list(Path("/proc/self/fd").iterdir())) == before


def test_one_core_or_a_small_tree_runs_in_one_process(monkeypatch: pytest.MonkeyPatch) -> None:
    with pool.Pool() as workers:
        assert not workers.start(pool.SMALL - 1)
        assert workers.executor is None
    monkeypatch.setattr(pool, "usable_cores", lambda: 1)
    with pool.Pool() as workers:
        assert not workers.start(10 * pool.SMALL)
        task = workers.run(len, "here")
        assert task.future is None and task.result() == 4


def test_the_handlers_it_replaced_are_restored() -> None:
    before = signal.getsignal(signal.SIGTERM)
    with pool.Pool():
        assert signal.getsignal(signal.SIGTERM) is not before
    assert signal.getsignal(signal.SIGTERM) is before


@pytest.mark.wheel
def test_doctor_with_stderr_closed_still_answers(tree: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(tree)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, check=False,
        preexec_fn=lambda: os.close(2),
    )  # fmt: skip
    assert done.returncode == 5
    assert done.stdout.startswith("capability 12 (SGLang 0.5.9): ")


@pytest.mark.wheel
@pytest.mark.parametrize("args", [[], ["--model", KIMI]])
def test_doctor_as_a_command_says_what_it_says_in_process(tree: Path, args: list[str]) -> None:
    """`python -m sglpatch doctor` (with its workers) against the CLI run in-process."""
    command = ["doctor", "--target", str(tree), "--json", *args]
    started = subprocess.run(
        [sys.executable, "-m", "sglpatch", *command], capture_output=True, text=True, check=False
    )
    inside = CliRunner().invoke(app, command)
    assert started.returncode == inside.exit_code == 5, started.stderr
    assert json.loads(started.stdout) == json.loads(inside.stdout)


def test_doctor_that_failed_early_leaves_no_process(tmp_path: Path) -> None:
    """A usage error comes before any worker starts: nothing naming the target outlives it."""
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


def test_a_pool_closed_without_waiting_leaves_no_thread_for_pythons_exit_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After a Ctrl-C, `close(wait=False)` left the thread that reaps the workers running: at
    exit, Python's hook wrote to the wakeup pipe that thread was closing ("Exception ignored
    ... Bad file descriptor" after "interrupted", 3 runs in 35)."""
    monkeypatch.setattr(pool, "usable_cores", lambda: 2)
    for finished in (True, False):
        workers = pool.Pool()
        assert workers.start(pool.SMALL * 10)
        assert [t.result() for t in [workers.run(abs, -n) for n in range(8)]] == list(range(8))
        executor = workers.executor
        assert executor is not None
        thread = executor._executor_manager_thread  # type: ignore[attr-defined]
        if finished:
            workers.finish()
        workers.close(wait=False)
        assert thread is not None and not thread.is_alive(), finished
