"""Which GPUs are present, from a stand-in `nvidia-smi` on PATH: one part, two parts, hanging,
failing, printing garbage, absent."""

from __future__ import annotations

import shutil
import stat
import time
from pathlib import Path

import pytest

from sglpatch.doctor.launch.gpu import Gpus, parse_capabilities, present_gpus

# The stand-in answers only the query doctor asks (any other arguments: exit 2, as a real
# nvidia-smi does for a bad option), so the test also proves what is asked.
QUERY = (
    'if [ "$1" != --query-gpu=compute_cap ] || [ "$2" != --format=csv,noheader ]; then exit 2; fi\n'
)


def stand_in(tmp_path: Path, body: str) -> dict[str, str]:
    """An environment whose PATH holds only a `nvidia-smi` running `body` (sh)."""
    folder = tmp_path / "bin"
    folder.mkdir()
    script = folder / "nvidia-smi"
    script.write_text("#!/bin/sh\n" + QUERY + body)
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return {"PATH": str(folder)}


def test_one_part(tmp_path: Path) -> None:
    found = present_gpus(stand_in(tmp_path, "echo 12.0\necho 12.0\n"))
    assert found.capabilities == ((12, 0), (12, 0)) and found.parts == ((12, 0),)
    assert found.source.endswith("/nvidia-smi") and not found.reason
    assert found.describe() == "12.0 x2 (from nvidia-smi)"


def test_two_parts_are_both_reported(tmp_path: Path) -> None:
    found = present_gpus(stand_in(tmp_path, "printf '12.1\\n9.0\\n'\n"))
    assert found.parts == ((12, 1), (9, 0))
    assert found.describe() == "12.1, 9.0 (from nvidia-smi)"


def test_a_hanging_nvidia_smi_is_stopped_at_its_bound(tmp_path: Path) -> None:
    started = time.monotonic()
    sleep = shutil.which("sleep")
    assert sleep is not None
    found = present_gpus(stand_in(tmp_path, f"exec {sleep} 60\n"), seconds=0.5)
    assert time.monotonic() - started < 5
    assert found.capabilities == () and "time bound" in found.reason


def test_a_failing_nvidia_smi_says_why(tmp_path: Path) -> None:
    body = "echo 'NVIDIA-SMI has failed because it could not communicate with the NVIDIA driver.'\nexit 9\n"
    found = present_gpus(stand_in(tmp_path, body))
    assert found.capabilities == ()
    assert found.reason.startswith("nvidia-smi failed (exit 9: NVIDIA-SMI has failed")
    assert found.describe().startswith("unknown (nvidia-smi failed")


@pytest.mark.parametrize("printed", ["[N/A]\n", "12.0\nWarning: something\n", "", "12\n"])
def test_garbage_is_no_answer(tmp_path: Path, printed: str) -> None:
    found = present_gpus(stand_in(tmp_path, f"printf '{printed}'\n"))
    assert found.capabilities == () and found.reason.startswith("nvidia-smi ")


def test_absent(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    found = present_gpus({"PATH": str(tmp_path / "empty")})
    assert found == Gpus((), "", "nvidia-smi is not on PATH")


def test_unexecutable_is_no_answer(tmp_path: Path) -> None:
    env = stand_in(tmp_path, "echo 12.0\n")
    script = Path(env["PATH"]) / "nvidia-smi"
    script.write_text("#!/no/such/interpreter\n")
    found = present_gpus(env)
    assert found.capabilities == () and "could not be started" in found.reason


def test_parse_ignores_blank_lines_and_spaces() -> None:
    assert parse_capabilities(" 12.0 \n\n9.0\n").capabilities == ((12, 0), (9, 0))
    assert parse_capabilities("12.0\r\n").capabilities == ((12, 0),)
