"""doctor on hostile input: what it cannot read or parse is listed as not judged and the answer
is not "ready"; an unknown release is a usage error; FIFOs, devices and sleeping plugins do not
hang it; a signal ends it with every process it started; bad --model / config.json input is a
one-line usage error, never an internal error."""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.doctor.read import pool
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"
GATE = "import torch\nif torch.cuda.get_device_capability()[0] >= 10:\n    x = "
DEEP = {
    "terms": GATE + " + ".join(["a"] * 3000) + "\n",  # RecursionError in ast.parse
    "nesting": GATE + "not " * 100_000 + "a\n",  # MemoryError in ast.parse
}


def one_line_error(stderr: str, *words: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sglpatch: error: "), stderr[:2000]
    assert "Traceback" not in stderr and "internal error" not in stderr, stderr[:2000]
    assert len(lines[0]) < 400, lines[0][:400]
    assert all(word in lines[0] for word in words), lines[0]
    return lines[0]


def doctor(runner: CliRunner, site: Path, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["doctor", "--target", str(site), *args])
    return result.exit_code, result.stdout, result.stderr


def not_judged(stdout: str) -> list[str]:
    """The files the 'Not judged' section lists."""
    lines = stdout.split("\nNot judged (could not be read or parsed): ", 1)
    return (
        [line.split(":")[0].strip() for line in lines[1].splitlines()[1:]] if len(lines) > 1 else []
    )


@pytest.fixture
def applied_059(site_059: Path, tmp_path: Path) -> Path:
    """The real 0.5.9's patch targets after `sglpatch apply`: doctor says ready there."""
    api.apply(site_059, None, tmp_path / "ledger")
    return site_059


# --- item 7: unknown is not ready ------------------------------------------------------------


def test_a_release_that_cannot_be_read_is_exit_2_unless_given(
    runner: CliRunner, site_059: Path
) -> None:
    """It said "capability 12 (SGLang, release unknown): ready" and exit 0."""
    for info in site_059.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    (site_059 / "sglang" / "_version.py").unlink()
    code, out, err = doctor(runner, site_059)
    assert code == ExitCode.USAGE and out == ""
    one_line_error(err, "cannot tell which SGLang release", "--release")
    code, out, err = doctor(runner, site_059, "--release", SEED)
    assert code == ExitCode.GAPS, err
    assert out.startswith("capability 12 (SGLang 0.5.9): ")
    code, _, err = doctor(runner, site_059, "--release", "0.5.x")
    assert code == ExitCode.USAGE
    one_line_error(err, "--release '0.5.x'")


def test_a_mismatched_release_is_refused(runner: CliRunner, site_059: Path) -> None:
    code, _, err = doctor(runner, site_059, "--release", "0.5.10")
    assert code == ExitCode.REFUSED
    one_line_error(err, "0.5.10", SEED)


@pytest.mark.skipif(not Path("/proc/self/mem").exists(), reason="needs Linux's /proc")
def test_an_unreadable_model_module_is_not_judged_not_ready(
    runner: CliRunner, applied_059: Path
) -> None:
    """It said "ready", exit 0, with "0 of 0 generation models"."""
    code, out, _ = doctor(runner, applied_059, "--model", "kimi_k25")
    assert code == 0 and out.splitlines()[0].endswith(": ready"), out
    kimi = applied_059 / KIMI
    kimi.unlink()
    kimi.symlink_to("/proc/self/mem")  # a regular file that no one can read, root included
    code, out, err = doctor(runner, applied_059, "--model", "kimi_k25")
    assert code == ExitCode.GAPS, (out, err)
    assert not out.splitlines()[0].endswith(": ready") and "not judged" in out.splitlines()[0]
    assert KIMI in not_judged(out)
    assert f"EAGLE-3 on kimi_k25: not judged ({KIMI} not read)" in out
    assert "0 of 0 generation models" not in out
    result = runner.invoke(app, ["doctor", "-t", str(applied_059), "-m", "kimi_k25", "--json"])
    assert result.exit_code == ExitCode.GAPS and json.loads(result.stdout)["ready"] is False


# --- item 9: only regular files are read; nothing hangs or outlives doctor -------------------


def _run_doctor(site: Path, *args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    """`python -m sglpatch doctor` in its own session: on a hang, all of it is killed."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(site), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
        pytest.fail(f"doctor {' '.join(args)} did not finish in {timeout} s")
    return subprocess.CompletedProcess(process.args, process.returncode, out, err)


@pytest.mark.parametrize(
    ("name", "kind"),
    [
        ("sglang/srt/x.py", "fifo"),
        ("sglang/srt/models/x.py", "fifo"),
        ("sglang/aaa.py", "link to a fifo"),
        ("sglang/srt/zero.py", "link to /dev/zero"),
    ],
)
def test_files_that_are_not_regular_files_do_not_hang_doctor(
    applied_059: Path, tmp_path: Path, name: str, kind: str
) -> None:
    path = applied_059 / name
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "link to a fifo":
        os.mkfifo(tmp_path / "fifo")
        path.symlink_to(tmp_path / "fifo")
    else:
        path.symlink_to("/dev/zero")
    done = _run_doctor(applied_059)
    assert done.returncode == ExitCode.GAPS, done.stderr
    assert done.stderr == ""
    assert "1 file could not be read or parsed (not judged)" in done.stdout.splitlines()[0]
    assert not_judged(done.stdout) == [name]
    assert f"{name}: cannot be read: not a regular file" in done.stdout


SLEEPY = '''
"""A test plugin whose codemod never ends."""

from __future__ import annotations

import os
import time

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import Patch


class Sleepy(Patch):
    """Sleeps in its transform, through whatever it is sent."""

    id = "sleepy"
    description = "sleeps"
    symptom = "a plugin that never ends"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release: Version) -> str | None:
        return "srt/distributed/device_communicators/all_reduce_utils.py"

    def transform(self, module, release):  # type: ignore[no-untyped-def]
        started = os.environ.get("SLEEPY_STARTED")
        if started:
            open(started, "w").close()
        while True:
            try:
                time.sleep(3600)
            except Exception:
                pass

    def postcondition(self, module, release):  # type: ignore[no-untyped-def]
        pass
'''


@pytest.fixture
def sleepy(tmp_path: Path) -> Path:
    folder = tmp_path / "sleepy-catalog"
    folder.mkdir()
    (folder / "sleepy.py").write_text(textwrap.dedent(SLEEPY))
    return folder


def test_a_plugin_that_sleeps_is_stopped_and_named(applied_059: Path, sleepy: Path) -> None:
    """Its transform never returns: doctor gives it a time limit (shortened here), then names it
    as a blocker whose patch fails."""
    script = textwrap.dedent(
        f"""
        import json
        from pathlib import Path
        from sglpatch import api
        from sglpatch.doctor import coverage
        coverage.PLUGIN_TIME_LIMIT = 1.0
        found = api.diagnose(Path({str(applied_059)!r}), catalog=Path({str(sleepy)!r})).diagnosis
        print(json.dumps([[b.source, b.note] for b in found.blockers]))
        """
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("the sleeping plugin hung doctor")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == [
        ["sleepy", "the patch fails: stopped: its code ran longer than 1 s"]
    ]


def _processes_with(marker: str) -> list[int]:
    """Processes whose environment holds `marker` (doctor's children inherit it)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                if marker.encode() in (entry / "environ").read_bytes():
                    stat = (entry / "stat").read_text()
                    if stat.rsplit(")", 1)[1].split()[0] != "Z":  # a zombie is no survivor
                        found.append(int(entry.name))
            except OSError:
                continue
    return found


@pytest.fixture
def whole_059(tmp_path: Path) -> Path:
    """The whole real 0.5.9 (1,000 files and more): doctor opens its worker processes."""
    return wheels.full_tree(SEED, tmp_path / "whole")


@pytest.mark.skipif(not Path("/proc/self/environ").exists(), reason="needs Linux's /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGHUP])
@pytest.mark.parametrize("tree", ["applied_059", "whole_059"])
def test_a_signal_to_doctor_ends_every_process_it_started(
    request: pytest.FixtureRequest, tree: str, sleepy: Path, tmp_path: Path, signum: int
) -> None:
    """While a plugin sleeps (in doctor itself on a small tree; on the whole tree, with two
    cores, in a worker process), `kill -TERM` of doctor left its workers running, reparented
    to init, and the caller's pipe open."""
    applied_059 = request.getfixturevalue(tree)
    marker = f"SGLPATCH_TEST_MARKER={uuid.uuid4().hex}"
    started = tmp_path / "started"
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1], "SLEEPY_STARTED": str(started)}
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "doctor", "--target", str(applied_059),
         "--catalog", str(sleepy)],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), "the plugin never ran"
        os.kill(process.pid, signum)
        assert process.stdout is not None
        ready, _, _ = select.select([process.stdout], [], [], 10)
        assert ready, "the caller's pipe is still open 10 s after the signal"
        while process.stdout.read1(1 << 16):  # type: ignore[attr-defined]
            ready, _, _ = select.select([process.stdout], [], [], 10)
            assert ready, "the caller's pipe is still open 10 s after the signal"
        assert process.wait(timeout=10) in (-signum, 128 + signum)
        deadline = time.monotonic() + 5
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_with(marker) == []
    finally:
        with_marker = _processes_with(marker)
        for pid in with_marker:  # what the old code left behind
            os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            process.kill()
        process.wait()


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
@pytest.mark.skipif(pool.usable_cores() < 2, reason="one core: no worker processes")
def test_the_workers_die_with_doctor_even_on_sigkill() -> None:
    """SIGKILL runs no handler: the kernel ends the workers (they asked to die with doctor)."""
    marker = f"SGLPATCH_TEST_MARKER={uuid.uuid4().hex}"
    script = textwrap.dedent(
        """
        import os, signal, time
        from sglpatch.doctor.read import pool
        with pool.Pool() as workers:
            assert workers.start(pool.SMALL)
            task = workers.run(time.sleep, 3600)
            while not task.future.running():
                time.sleep(0.05)
            os.kill(os.getpid(), signal.SIGKILL)
        """
    )
    env = {**os.environ, marker.split("=")[0]: marker.split("=")[1]}
    try:
        done = subprocess.run(
            [sys.executable, "-c", script], env=env, timeout=60, check=False,
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        assert done.returncode == -signal.SIGKILL
        deadline = time.monotonic() + 5
        while _processes_with(marker) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert _processes_with(marker) == []
    finally:
        for pid in _processes_with(marker):  # what the old code left behind
            os.kill(pid, signal.SIGKILL)


# --- item 10: input that exhausts the parser, or is no name at all ---------------------------


@pytest.mark.parametrize("shape", sorted(DEEP))
def test_a_tree_file_too_deep_to_parse_is_not_judged(
    runner: CliRunner, applied_059: Path, shape: str
) -> None:
    """RecursionError / MemoryError in ast.parse was an internal error (70)."""
    (applied_059 / "sglang" / "srt" / "deep.py").write_text(DEEP[shape])
    code, out, err = doctor(runner, applied_059)
    assert code == ExitCode.GAPS and err == "", err
    assert "1 file could not be read or parsed (not judged)" in out.splitlines()[0]
    assert "sglang/srt/deep.py: cannot be parsed: nested too deeply" in out


def test_a_version_file_too_deep_to_parse_is_an_unknown_release(
    runner: CliRunner, site_059: Path
) -> None:
    for info in site_059.glob("sglang-*.dist-info"):
        shutil.rmtree(info)
    version_file = site_059 / "sglang" / "_version.py"
    version_file.write_text(version_file.read_text() + DEEP["terms"])
    code, _, err = doctor(runner, site_059)
    assert code == ExitCode.USAGE
    one_line_error(err, "cannot tell which SGLang release")


@pytest.mark.parametrize(
    ("config", "words"),
    [
        ('{"architectures": ' + "[" * 10_000 + "]" * 10_000 + "}", ["nested too deeply"]),
        ('{"architectures": ["\\ud800"]}', ["not a class name"]),
        ('{"architectures": ["' + "A" * 10_000_000 + '"]}', ["not a class name"]),
        ('{"architectures": ["Kimi\\u0000"]}', ["not a class name"]),
    ],
    ids=["nested", "lone-surrogate", "10MB-name", "nul"],
)
def test_a_hostile_config_json_is_a_usage_error(
    runner: CliRunner, site_059: Path, tmp_path: Path, config: str, words: list[str]
) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(config)
    code, out, err = doctor(runner, site_059, "--model-path", str(checkpoint))
    assert code == ExitCode.USAGE and out == ""
    one_line_error(err, "--model-path", "config.json", *words)


def test_a_config_json_that_is_a_fifo_does_not_hang(site_059: Path, tmp_path: Path) -> None:
    checkpoint = tmp_path / "checkpoint"
    checkpoint.mkdir()
    os.mkfifo(checkpoint / "config.json")
    done = _run_doctor(site_059, "--model-path", str(checkpoint))
    assert done.returncode == ExitCode.USAGE
    one_line_error(done.stderr, "config.json", "not a regular file")


@pytest.mark.parametrize("name", ["a" * 300, "Kimi" * 2_500_000, "kimi/../../x", "\udcff"])
def test_a_model_name_that_cannot_be_one_is_a_usage_error(
    runner: CliRunner, site_059: Path, name: str
) -> None:
    """300 characters made the file name too long (ENAMETOOLONG): an internal error."""
    code, out, err = doctor(runner, site_059, "--model", name)
    assert code == ExitCode.USAGE and out == ""
    one_line_error(err, "--model")
