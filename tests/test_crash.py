"""Killed at any moment, sglpatch leaves every file whole and the next run finishes the job."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglpatch import api, fsio
from tests import wheels
from tests.conftest import snapshot
from tests.crashing import KILLED

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets("0.5.9")
# journal, a stage per file, ledger-commit, a replace per file
STEPS = ["journal", *["stage"] * len(TARGETS), "ledger-commit", *["replace"] * len(TARGETS)]
REPO = Path(__file__).resolve().parent.parent


def write_steps(site: Path, action: str) -> list[str]:
    """The write steps a normal run takes, in order (journal, stage..., ledger-commit, ...)."""
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


def sglpatch(*args: str, kill_at: int | None = None) -> subprocess.CompletedProcess[str]:
    prefix = ["-m", "tests.crashing", str(kill_at), "--"] if kill_at else ["-m", "sglpatch"]
    return subprocess.run(
        [sys.executable, *prefix, *args], capture_output=True, text=True, cwd=REPO, check=False
    )


@pytest.fixture(scope="module")
def reference(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict[str, bytes]]:
    site = wheels.site_packages("0.5.9", tmp_path_factory.mktemp("ref"), TARGETS)
    pristine = snapshot(site)
    api.apply(site, None, tmp_path_factory.mktemp("ledger"))
    return {"pristine": pristine, "patched": snapshot(site)}


def test_the_write_steps_are_the_ones_the_journal_covers(site_059: Path) -> None:
    steps = write_steps(site_059, "apply")
    assert steps == STEPS
    assert write_steps(site_059, "revert") == steps


@pytest.mark.parametrize("action", ["apply", "revert"])
@pytest.mark.parametrize("kill_at", range(1, len(STEPS) + 1))
def test_killed_at_every_write_step(
    action: str, kill_at: int, site_059: Path, reference: dict[str, dict[str, bytes]]
) -> None:
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
    done = "applied" if action == "apply" else "not applied"
    assert states == {
        i: done if state == "applied" else state
        for i, state in wheels.expected_states("0.5.9").items()
    }
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
