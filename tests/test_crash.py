"""Killed at any moment, sglpatch leaves every file whole and the next run finishes the job."""

from __future__ import annotations

import contextlib
import functools
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.errors import ExitCode
from sglpatch.store import fsio
from tests.conftest import snapshot
from tests.support import parsing, wheels
from tests.support.crashing import KILLED
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets(SEED)
CHANGED = wheels.applied_targets(SEED)  # TARGETS less the files whose fix is upstream
# journal, a stage per file, a replace per file, then the ledger commit
STEPS = ["journal", *["stage"] * len(CHANGED), *["replace"] * len(CHANGED), "ledger-commit"]
# What `status` says after a whole apply or revert of 0.5.9 (patches fixed upstream or not for
# this release keep their own state).
APPLIED = wheels.expected_states(SEED, "applied")
REVERTED = wheels.expected_states(SEED, "not applied")
REPO = Path(__file__).resolve().parent.parent


def distinct_steps(steps: list[str]) -> list[int]:
    """1-based indices of the first, middle and last step of each kind in `steps`.

    For apply and revert: the journal, the first/middle/last stage and replace, and the ledger
    commit. A step between two of its kind behaves as they do, so killing at
    these covers every kind of step and both of its boundaries without one subprocess pair per
    file: the number stays fixed as the catalogue grows.
    """
    picked: set[int] = set()
    for kind in dict.fromkeys(steps):
        at = [i for i, step in enumerate(steps, 1) if step == kind]
        picked |= {at[0], at[len(at) // 2], at[-1]}
    return sorted(picked)


def write_steps(site: Path, action: str) -> list[str]:
    """The write steps a normal run takes, in order (journal, stage..., replace..., ledger-commit)."""
    steps: list[str] = []
    fsio.fault_hook = lambda step, path: steps.append(step)
    try:
        api.apply(site, None) if action == "apply" else api.revert(site)
    finally:
        fsio.fault_hook = None
    return steps


def assert_whole(site: Path, pristine: dict[str, bytes], patched: dict[str, bytes]) -> None:
    for member in TARGETS:
        assert (site / member).read_bytes() in (pristine[member], patched[member]), member


def sglpatch(
    *args: str, kill_at: int | None = None, signal_at: str | None = None
) -> subprocess.CompletedProcess[str]:
    when = signal_at or (str(kill_at) if kill_at else None)
    prefix = ["-m", "tests.support.crashing", when, "--"] if when else ["-m", "sglpatch"]
    return subprocess.run(
        [sys.executable, *prefix, *args], capture_output=True, text=True, cwd=REPO, check=False
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    site = wheels.site_packages(SEED, tmp_path_factory.mktemp("ref"), TARGETS)
    pristine = snapshot(site)
    api.apply(site, None, tmp_path_factory.mktemp("ledger"))
    return {"pristine": pristine, "patched": snapshot(site)}


def test_the_write_steps_are_the_ones_the_journal_covers(site_059: Path) -> None:
    steps = write_steps(site_059, "apply")
    assert steps == STEPS
    kinds = [steps[i - 1] for i in distinct_steps(steps)]  # what the kill test below covers
    assert kinds == ["journal", *["stage"] * 3, *["replace"] * 3, "ledger-commit"]
    assert write_steps(site_059, "revert") == steps


@pytest.mark.parametrize("action", ["apply", "revert"])
@pytest.mark.parametrize("kill_at", distinct_steps(STEPS))
def test_killed_at_every_kind_of_write_step(
    action: str, kill_at: int, site_059: Path, reference: dict[str, dict[str, bytes]]
) -> None:
    """Killed (os._exit) at each kind of write step: the journal, the first, middle and last
    stage, the first, middle and last replace, the ledger commit (see `distinct_steps`; the
    same test killed at every index took 2 x (2 x files + 3) subprocess pairs)."""
    pristine, patched = reference["pristine"], reference["patched"]
    if action == "revert":
        assert api.apply(site_059, None).written
    killed = sglpatch(action, "--target", str(site_059), kill_at=kill_at)
    assert killed.returncode == KILLED, killed.stderr
    assert_whole(site_059, pristine, patched)

    # The next run of the same command finishes it, then does what it was asked.
    again = sglpatch(action, "--target", str(site_059))
    assert again.returncode == 0, again.stderr
    expected = patched if action == "apply" else pristine
    assert snapshot(site_059) == expected
    assert not list(site_059.rglob("*.sglpatch"))
    states = {row.id: row.state for row in api.status(site_059).patches}
    assert states == (APPLIED if action == "apply" else REVERTED)
    if action == "apply":
        api.revert(site_059)
        assert snapshot(site_059) == pristine


def test_killed_at_random_moments(site_059: Path, reference: dict[str, dict[str, bytes]]) -> None:
    """Real SIGKILLs at random times, alternating apply and revert, 12 rounds."""
    pristine, patched = reference["pristine"], reference["patched"]
    rng = random.Random(20261129)
    for round_ in range(12):
        action = "apply" if round_ % 2 == 0 else "revert"
        process = subprocess.Popen(
            [sys.executable, "-m", "sglpatch", action, "--target", str(site_059)],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        time.sleep(rng.uniform(0.0, 1.2))
        os.kill(process.pid, signal.SIGKILL)
        process.wait()
        assert_whole(site_059, pristine, patched)
    assert sglpatch("apply", "--target", str(site_059)).returncode == 0
    assert snapshot(site_059) == patched
    assert sglpatch("revert", "--target", str(site_059)).returncode == 0
    assert snapshot(site_059) == pristine


def truthful(site: Path, pristine: dict[str, bytes], patched: dict[str, bytes]) -> None:
    """`status` says of each patch what its file holds: patched bytes are "applied"."""
    report = api.status(site)
    for row in report.patches:
        if APPLIED[row.id] != "applied":  # upstream's fix or not for this release: never ours
            assert row.state == APPLIED[row.id], (row, report.interrupted)
            continue
        assert row.file is not None
        held = (site / row.file).read_bytes()
        expected = "applied" if held == patched[row.file] else "not applied"
        assert held in (patched[row.file], pristine[row.file]), row.file
        assert row.state == expected, (row, report.interrupted)


def start_from(site: Path, action: str, reference: dict[str, dict[str, bytes]]) -> None:
    """Patched before a revert, pristine before an apply (finishing any journal first)."""
    if action == "revert":
        api.apply(site, None)
        assert snapshot(site) == reference["patched"]
    else:
        api.revert(site)
        assert snapshot(site) == reference["pristine"]


def converges(site: Path, action: str, reference: dict[str, dict[str, bytes]]) -> None:
    """The same command run again finishes the job: every byte original, or every byte patched."""
    getattr(api, action)(site, *([None] if action == "apply" else []))
    expected = reference["patched" if action == "apply" else "pristine"]
    assert snapshot(site) == expected
    assert not list(site.rglob("*.sglpatch"))
    states = {row.id: row.state for row in api.status(site).patches}
    assert states == (APPLIED if action == "apply" else REVERTED)


def test_a_revert_whose_commit_fails_leaves_everything_revertable(
    site_059: Path, tmp_path: Path, reference: dict[str, dict[str, bytes]]
) -> None:
    """The issue's repro: a stale index.lock in the ledger makes revert fail (exit 4)."""
    ledger = tmp_path / "L"
    assert sglpatch("apply", "--target", str(site_059), "--ledger", str(ledger)).returncode == 0
    (lock,) = [d / ".git" / "index.lock" for d in (ledger / "targets").iterdir()]
    lock.touch()
    failed = sglpatch("revert", "--target", str(site_059), "--ledger", str(ledger))
    assert failed.returncode == 4, failed.stderr
    assert snapshot(site_059) == reference["patched"]
    status = sglpatch("status", "--target", str(site_059), "--ledger", str(ledger)).stdout
    applied = list(APPLIED.values()).count("applied")
    assert status.count("  applied ") == applied and "not applied" not in status
    lock.unlink()
    again = sglpatch("revert", "--target", str(site_059), "--ledger", str(ledger))
    reverted = f"Reverted {len(CHANGED)} file(s)"
    assert again.returncode == 0 and reverted in again.stdout, again.stdout
    assert snapshot(site_059) == reference["pristine"]


def test_sigint_at_random_moments(site_059: Path, reference: dict[str, dict[str, bytes]]) -> None:
    """24 real SIGINTs in-process at seeded random moments of apply and revert.

    Half at a random time in the whole run, half sent at a random write step (from inside it).
    Ctrl-C before the journal stops the run with nothing written; from the journal on it is held
    until the change is whole. Either way status tells the truth, and the next run converges.
    """
    rng = random.Random(20261130)
    took = {}
    for action in ("revert", "apply"):
        start_from(site_059, action, reference)
        began = time.monotonic()
        with parsing.afresh():  # the moments below are drawn over a run that parses every file
            getattr(api, action)(site_059, *([None] if action == "apply" else []))
        took[action] = time.monotonic() - began
    in_writes = 0
    for round_ in range(24):
        action = ("apply", "revert")[round_ % 2]
        start_from(site_059, action, reference)
        run = functools.partial(api.apply, site_059, None)
        if action == "revert":
            run = functools.partial(api.revert, site_059)
        step = rng.randint(1, len(STEPS)) if round_ % 4 >= 2 else None
        with parsing.afresh() if step is None else contextlib.nullcontext():
            hit = sigint_during(run, 0.0 if step else rng.uniform(0, took[action]), step)
        in_writes += hit and step is not None
        assert_whole(site_059, reference["pristine"], reference["patched"])
        truthful(site_059, reference["pristine"], reference["patched"])
        converges(site_059, action, reference)
    assert in_writes == 12  # a Ctrl-C held through the writes is still reported afterwards


def sigint_during(call: Callable[[], object], delay: float, step: int | None = None) -> bool:
    """Run `call`; a timer sends this process SIGINT `delay` seconds after it starts, or the
    `step`th write step sends it itself. True if the KeyboardInterrupt came."""
    timer = threading.Timer(delay, os.kill, (os.getpid(), signal.SIGINT))
    seen = 0

    def at_step(name: str, path: Path) -> None:
        nonlocal seen
        seen += 1
        if seen == step:
            os.kill(os.getpid(), signal.SIGINT)

    try:
        try:
            if step is None:
                timer.start()
            else:
                fsio.fault_hook = at_step
            call()
        finally:
            fsio.fault_hook = None
            timer.cancel()
            if timer.is_alive():
                timer.join()
            for _ in range(1000):  # let a signal that was just sent be handled in here
                pass
    except KeyboardInterrupt:
        return True
    return False


def test_sigkill_at_random_moments(site_059: Path, reference: dict[str, dict[str, bytes]]) -> None:
    """22 real SIGKILLs at seeded random moments inside the write steps of apply and revert."""
    rng = random.Random(20261131)
    for round_ in range(22):
        action = ("revert", "apply")[round_ % 2]
        start_from(site_059, action, reference)
        when = f"{signal.SIGKILL}@{rng.randint(1, len(STEPS))}+{rng.uniform(0, 0.01):.4f}"
        killed = sglpatch(action, "--target", str(site_059), signal_at=when)
        assert killed.returncode in (-signal.SIGKILL, 0), killed.stderr
        assert_whole(site_059, reference["pristine"], reference["patched"])
        truthful(site_059, reference["pristine"], reference["patched"])
        converges(site_059, action, reference)


def test_sigint_from_the_command_line(
    site_059: Path, reference: dict[str, dict[str, bytes]]
) -> None:
    """Ctrl-C at a write step of the CLI: exit 130 (or 0 if it came after), never half done."""
    rng = random.Random(20261132)
    for round_ in range(4):
        action = ("revert", "apply")[round_ % 2]
        start_from(site_059, action, reference)
        when = f"{signal.SIGINT}@{rng.randint(1, len(STEPS))}+{rng.uniform(0, 0.01):.4f}"
        run = sglpatch(action, "--target", str(site_059), signal_at=when)
        assert run.returncode in (ExitCode.INTERRUPTED, 0), run.stderr
        assert "Traceback" not in run.stderr
        # held until the change was whole: it is done, and no journal is left to finish
        expected = reference["patched" if action == "apply" else "pristine"]
        assert snapshot(site_059) == expected
        assert api.status(site_059).interrupted is None
