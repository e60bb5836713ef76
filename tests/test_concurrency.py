"""Two or more sglpatch runs on one target never both write."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.errors import ExitCode
from sglpatch.store import Ledger, default_directory
from sglpatch.target import find_target
from tests.support import proofs, wheels

pytestmark = pytest.mark.wheel

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
REPO = Path(__file__).resolve().parent.parent


def spawn(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "sglpatch", *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )


def test_three_simultaneous_applies_patch_once(site_059: Path) -> None:
    runs = [spawn("apply", "--target", str(site_059)) for _ in range(3)]
    results = [(p.wait(), *p.communicate()) for p in runs]
    assert [code for code, _, _ in results] == [0, 0, 0], results
    outputs = [out for _, out, _ in results]
    patched = f"Patched {len(wheels.applied_targets('0.5.9'))} file(s)"
    assert sum(patched in out for out in outputs) == 1
    assert sum("Nothing to do" in out for out in outputs) == 2
    source = (site_059 / SIZES).read_bytes()
    assert source.count(b"    12: {") == 1
    table = proofs.size_table(source, "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES")
    assert table[12] == table[10]
    entries = api.log(site_059).entries
    assert [e.summary.split(":")[0] for e in entries] == ["apply"]


@pytest.mark.parametrize("other_ledger", [False, True])
def test_a_held_target_makes_the_next_run_wait_then_refuse(
    site_059: Path, tmp_path: Path, other_ledger: bool
) -> None:
    record = Ledger(default_directory()).record(find_target(site_059, None))
    args = ["apply", "--target", str(site_059)]
    if other_ledger:  # a second ledger must not let a second writer in
        args += ["--ledger", str(tmp_path / "elsewhere")]
    with record.locked():
        waiting = spawn(*args, env={"SGLPATCH_LOCK_TIMEOUT": "0.5"})
        code = waiting.wait()
        _, err = waiting.communicate()
    assert code == ExitCode.REFUSED
    assert "another sglpatch is working on" in err and "waited 0.5s" in err
    assert api.status(site_059).patches[0].state == "not applied"
