"""doctor's probes of ptxas and nvcc (`sglpatch.doctor.kernels.bounded`): bounded in time and in
output whatever the tool does, and no probe outlives doctor, however doctor ends.

The hostile tools stand in for Triton's bundled ptxas. Each writes its process numbers to a
file, so what is left running is checked by number, not by a name another run could share.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import tracemalloc
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.doctor.kernels import bounded, tools
from tests.doctor.test_doctor_kernels import environment
from tests.test_kernels_packages import by_package, env_with, site, write

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="reads /proc; PR_SET_PDEATHSIG is Linux's"
)
__all__ = ["environment", "site"]  # the fixtures: 0.5.9 beside its kernel wheels in miniature

PTXAS = "triton/backends/nvidia/bin/ptxas"
ANSWER = """case "$1" in
  --version) echo "Cuda compilation tools, release 12.8, V12.8.1";;
  --help) printf -- "--gpu-name\\n        Allowed values for this option:  'sm_120a'.\\n\\n";;
esac
"""


# A child in a session of its own, holding the probe's output open; the probe goes on once it
# is there (else the probe's end could kill it before it left the probe's group).
HOLDING = """setsid sh -c 'echo $$ >> "$0.held"; exec sleep 30' {started} &
while [ ! -s {started}.held ] || [ $(wc -l < {started}.held) -lt $(wc -l < {started}) ]; do
  sleep 0.01
done"""


def hostile(path: Path, body: str) -> Path:
    write(path, "#!/bin/sh\n" + textwrap.dedent(body))
    path.chmod(0o755)
    return path


def numbers(path: Path) -> list[int]:
    return [int(n) for n in path.read_text().split()] if path.exists() else []


def alive(pid: int) -> bool:
    """Running (a zombie is not: it only waits for a parent, perhaps a container's init that
    reaps nothing, to read its end)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"


def living(pids: list[int], grace: float = 3.0) -> list[int]:
    """Those of `pids` still running after `grace` seconds at most."""
    deadline = time.monotonic() + grace
    while any(map(alive, pids)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid for pid in pids if alive(pid)]


@pytest.fixture
def started(tmp_path: Path) -> Iterator[Path]:
    """The file the hostile tools write their process numbers to; what they leave is killed."""
    path = tmp_path / "pids"
    yield path
    for pid in numbers(path) + numbers(Path(f"{path}.held")):
        if alive(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_probe_that_leaves_a_process_holding_its_output_is_not_waited_for(
    site: Path, tmp_path: Path, started: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Its child left the session (setsid) with the pipe open: doctor waited for that child's
    end (102 s measured), past its limit, and called a ptxas that had answered hanging."""
    monkeypatch.setattr(tools, "_TIMEOUT_S", 5.0)
    hostile(
        site / PTXAS,
        f"""\
        echo $$ >> {started}
        {HOLDING.format(started=started)}
        """
        + ANSWER,
    )
    begun = time.monotonic()
    triton = by_package(site, env_with(tmp_path))["triton"]
    assert time.monotonic() - begun < 2
    assert triton["ptxas_version"] == "12.8", triton["why"]
    assert triton["runs_on"] == {"12.0": True, "12.1": False}
    probes, held = numbers(started), numbers(Path(f"{started}.held"))
    assert len(probes) == len(held) == 2 and living(probes) == []  # --version and --help, both gone
    # Out of reach of its group: still running, its writes to the closed pipe fail.
    assert living(held, 0) == held


def test_a_probe_that_floods_its_output_is_cut_at_a_mebibyte(
    site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`yes` as ptxas: doctor read 2.4 GB in 10 s, then ended in a MemoryError."""
    monkeypatch.setattr(tools, "_TIMEOUT_S", 5.0)
    hostile(site / PTXAS, 'exec yes "Cuda compilation tools, release 12.8, V12.8.1"\n')
    tracemalloc.start()
    try:
        begun = time.monotonic()
        triton = by_package(site, env_with(tmp_path))["triton"]
        took = time.monotonic() - begun
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert "`ptxas --version` printed more than 1 MiB" in str(triton["why"])
    assert triton["runs_on"] == {"12.0": None, "12.1": None}
    assert took < 2 and peak < 8 << 20, (took, peak)


def test_a_tools_version_and_help_share_one_limit(
    tmp_path: Path, started: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A slow --version and a --help that never ends: each had the whole limit (1.6 s here)."""
    monkeypatch.setattr(tools, "_TIMEOUT_S", 1.0)
    slow = hostile(
        tmp_path / "ptxas",
        f"""\
        echo $$ >> {started}
        case "$1" in
          --version) sleep 0.6; echo "Cuda compilation tools, release 12.9, V12.9.86";;
          --help) exec sleep 1000;;
        esac
        """,
    )
    begun = time.monotonic()
    tool = tools.probe(slow, {"PATH": os.environ["PATH"]})
    assert time.monotonic() - begun < 1.3
    assert (tool.release, tool.targets, tool.problem) == ((12, 9), frozenset(), "")
    assert living(numbers(started)) == []


@pytest.mark.wheel
def test_doctor_with_a_ptxas_that_never_ends_answers_within_its_limit(
    environment: Path, started: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ptxas that never answers, and whose child holds its output from another session:
    doctor gave up at the limit, then waited for that child."""
    monkeypatch.setattr(tools, "_TIMEOUT_S", 1.0)
    hostile(
        environment / PTXAS,
        f"""\
        echo $$ >> {started}
        {HOLDING.format(started=started)}
        sleep 1000 &
        echo $! >> {started}
        wait
        """,
    )
    requests: list[bool] = []  # per probe: whether it asked the kernel to kill it with doctor
    asked = bounded._dying_with_parent

    def asking() -> object:
        request = asked()
        requests.append(request is not None)
        return request

    took: dict[str, float] = {}  # per tool: the seconds doctor spent on it
    probe_tool = tools.probe

    def timing(path: Path, environ: Mapping[str, str]) -> tools.Tool:
        begun = time.monotonic()
        try:
            return probe_tool(path, environ)
        finally:
            took[path.name] = time.monotonic() - begun

    monkeypatch.setattr(bounded, "_dying_with_parent", asking)
    monkeypatch.setattr(tools, "probe", timing)
    handlers = {signum: signal.getsignal(signum) for signum in (signal.SIGTERM, signal.SIGHUP)}
    report = api.diagnose(environment)
    triton = next(k for k in report.kernels or () if k.package == "triton")
    assert "`ptxas --version` ran longer than 1 s" in triton.why
    assert 1 <= took["ptxas"] < 1.5, took  # the old code went on waiting for the held child
    probe, child = numbers(started)
    [held] = numbers(Path(f"{started}.held"))
    assert living([probe, child], 1) == []  # the probe's group is killed
    assert living([held], 0) == [held]  # out of its reach: left, and not waited for
    # nvidia-smi (the session's stand-in) once, nvcc twice, ptxas once; doctor has no other
    # thread then: the kernel kills them with doctor
    assert requests == [True, True, True, True]
    assert {s: signal.getsignal(s) for s in handlers} == handlers


NEVER_ENDS = {
    # SIGKILL runs nothing in doctor: the kernel kills the probe, not what it started
    signal.SIGKILL: "echo $$ >> {started}\nexec sleep 1000\n",
    # the others end its whole group: itself and a child
    signal.SIGTERM: "echo $$ >> {started}\nsleep 1000 &\necho $! >> {started}\nwait\n",
}
NEVER_ENDS[signal.SIGHUP] = NEVER_ENDS[signal.SIGINT] = NEVER_ENDS[signal.SIGTERM]


@pytest.mark.wheel
@pytest.mark.parametrize(
    ("signum", "code"),
    [
        (signal.SIGKILL, -signal.SIGKILL),
        (signal.SIGTERM, -signal.SIGTERM),
        (signal.SIGHUP, -signal.SIGHUP),
        (signal.SIGINT, 130),  # Ctrl-C: "interrupted"
    ],
    ids=["SIGKILL", "SIGTERM", "SIGHUP", "SIGINT"],
)
def test_a_probe_dies_with_doctor_however_doctor_ends(
    environment: Path, started: Path, signum: int, code: int
) -> None:
    """While ptxas runs, doctor is ended: the probe ran on (its own session, reparented)."""
    hostile(environment / PTXAS, NEVER_ENDS[signal.Signals(signum)].format(started=started))
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(environment)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not numbers(started) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.2)  # its child started, and the probe is waited for
        probes = numbers(started)
        assert probes, "ptxas never ran"
        os.kill(process.pid, signum)
        assert process.wait(timeout=5) == code
        assert living(probes) == []
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
