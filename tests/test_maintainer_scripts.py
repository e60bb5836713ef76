"""scripts/sm120_triage.py and bench/run on bad input: one line, an exit code, nothing left behind.

Every bad value is refused before a wheel is read, so these tests need no wheels and no network
(a failed download is simulated with pip's own `PIP_NO_INDEX`), except the one marked `wheel`
that kills a real bench run while it fills its padded tree.
"""

from __future__ import annotations

import ast
import importlib
import json
import os
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from types import ModuleType

import pytest

from tests.support import wheels
from tests.support.releases import SEED, UPGRADE

TRIAGE = wheels.REPO / "scripts" / "sm120_triage.py"
BENCH = wheels.REPO / "bench" / "run"
KEPT = "the table a good run wrote\n"
# Two small wheels: a test that reaches them on the old code fails fast, not after 0.5.3 -> 0.5.23.
SMALL = ["--from", SEED, "--to", UPGRADE]


def _run(
    script: Path, args: Sequence[str], env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(script), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=60,
        cwd=wheels.REPO,  # the scripts run from the repository's root (scripts/__init__.py)
        check=False,
    )


def _assert_refused(
    done: subprocess.CompletedProcess[str], prog: str, code: int, *words: str
) -> None:
    """One line on stderr, `<prog>: error: ...`, holding `words`; the exit code; no traceback.

    A wheel download's progress line (`tests: downloading ...`) is no error, and not counted.
    """
    assert done.returncode == code, (done.returncode, done.stderr)
    lines = [line for line in done.stderr.splitlines() if not line.startswith("tests: download")]
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"{prog}: error: "), lines[0]
    for word in words:
        assert word in lines[0], (word, lines[0])


@pytest.fixture
def kept(tmp_path: Path) -> Path:
    """An output file from an earlier run: a refused run must leave it as it was."""
    path = tmp_path / "out" / "sm120-upstream.md"
    path.parent.mkdir()
    path.write_text(KEPT)
    return path


def _untouched(kept: Path) -> None:
    assert kept.read_text() == KEPT
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]  # no temporary file left


# --- scripts/sm120_triage.py -------------------------------------------------------------------

TRIAGE_PROG = "scripts/sm120_triage.py"


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (["--from", "banana"], ["--from", "'banana'", "not a release"]),
        (["--to", "0.5.x"], ["--to", "not a release"]),
        (["--from", "0.5.9+local"], ["--from", "not a release"]),
        (["--from", "0.5.9.post7"], ["--from", "0.5.9.post7", "not a release"]),
        (["--to", "0.5.12.post3"], ["--to", "0.5.12.post3"]),
        (["--from"], ["--from", "expected one argument"]),
        (["--frm", SEED], ["unrecognized arguments: --frm"]),
        (["--from", "0.5.23", "--to", "0.5.3"], ["0.5.23", "0.5.3", "no release"]),
        (["--from", SEED, "--to", SEED], [SEED, "no release"]),
        (["--from", UPGRADE, "--to", SEED], [UPGRADE, SEED, "no release"]),
    ],
)
def test_triage_refuses_a_bad_release_or_range_in_one_line(
    kept: Path, args: list[str], words: list[str]
) -> None:
    done = _run(TRIAGE, [*args, "--out", str(kept)])
    _assert_refused(done, TRIAGE_PROG, 2, *words)
    _untouched(kept)


def _verdicts(tmp_path: Path, content: bytes | str | object) -> Path:
    path = tmp_path / "verdicts.json"
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content)
    else:
        path.write_text(json.dumps(content))
    return path


GOOD_ROW = {"release": UPGRADE, "verdict": "new-feature", "description": "x", "hunks": []}


@pytest.mark.parametrize(
    ("content", "words"),
    [
        ("{not json", ["not JSON", "line 1"]),
        (b"\xff\xfe[]", ["not UTF-8"]),
        ({"release": UPGRADE}, ["a JSON list"]),
        ([UPGRADE], ["change 1", "object"]),
        (
            [GOOD_ROW, {"release": UPGRADE, "description": "x", "hunks": []}],
            ["change 2", "'verdict'"],
        ),
        ([{**GOOD_ROW, "release": 5}], ["change 1", "'release'"]),
        ([{**GOOD_ROW, "release": "soon"}], ["change 1", "'soon'"]),
        ([{**GOOD_ROW, "hunks": [["sglang/a.py"]]}], ["change 1", "'hunks'"]),
        ([{**GOOD_ROW, "hunks": "sglang/a.py"}], ["change 1", "'hunks'"]),
        ([{**GOOD_ROW, "patch": 3}], ["change 1", "'patch'"]),
        (
            [{**GOOD_ROW, "verdict": "maybe"}, {**GOOD_ROW, "verdict": "backported"}],
            ["'maybe'", "backported without patch"],
        ),
    ],
)
def test_triage_refuses_a_malformed_verdicts_file_in_one_line(
    tmp_path: Path, kept: Path, content: object, words: list[str]
) -> None:
    verdicts = _verdicts(tmp_path, content)
    done = _run(TRIAGE, [*SMALL, "--verdicts", str(verdicts), "--out", str(kept)])
    _assert_refused(done, TRIAGE_PROG, 2, "--verdicts", str(verdicts), *words)
    _untouched(kept)


@pytest.mark.parametrize("where", ["missing", "folder"])
def test_triage_refuses_a_verdicts_file_it_cannot_read(
    tmp_path: Path, kept: Path, where: str
) -> None:
    verdicts = tmp_path / "nowhere.json"
    if where == "folder":
        verdicts.mkdir()
    done = _run(TRIAGE, [*SMALL, "--verdicts", str(verdicts), "--out", str(kept)])
    _assert_refused(done, TRIAGE_PROG, 2, "--verdicts", str(verdicts))
    _untouched(kept)


@pytest.mark.parametrize(
    "where", ["missing folder", "file as folder", "a folder", "check a folder"]
)
def test_triage_refuses_an_out_it_cannot_write(tmp_path: Path, kept: Path, where: str) -> None:
    out = {
        "missing folder": tmp_path / "missing" / "o.md",
        "file as folder": kept / "o.md",
        "a folder": kept.parent,
        "check a folder": kept.parent,
    }[where]
    check = ["--check"] if where.startswith("check") else []
    done = _run(TRIAGE, [*SMALL, *check, "--out", str(out)])
    _assert_refused(done, TRIAGE_PROG, 2, "--out", str(out))
    _untouched(kept)
    assert not (tmp_path / "missing").exists()


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes in a read-only folder")
def test_triage_refuses_an_out_in_a_read_only_folder(kept: Path) -> None:
    kept.parent.chmod(0o555)
    try:
        done = _run(TRIAGE, [*SMALL, "--out", str(kept.parent / "o.md")])
    finally:
        kept.parent.chmod(0o755)
    _assert_refused(done, TRIAGE_PROG, 2, "--out", "cannot write")
    _untouched(kept)


def _load_triage() -> ModuleType:
    return importlib.import_module("scripts.sm120_triage")


def _edits_sys_path(source: str) -> bool:
    """The code (not its strings: a child's program may put a tree first on purpose) calls
    `sys.path.insert`, `.append` or `.extend`."""
    return any(
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in {"insert", "append", "extend"}
        and ast.unparse(node.func.value) == "sys.path"
        for node in ast.walk(ast.parse(source))
    )


def test_the_scripts_find_the_development_helpers_without_editing_sys_path() -> None:
    """scripts/ and tests/ import `tests.support` as a package of the repository's root (run
    from there as modules, scripts/__init__.py), never by putting a folder on `sys.path`."""
    found = [
        str(path.relative_to(wheels.REPO))
        for folder in ("scripts", "tests")
        for path in sorted((wheels.REPO / folder).rglob("*.py"))
        if _edits_sys_path(path.read_text(encoding="utf-8"))
    ]
    assert found == []
    assert _edits_sys_path("import sys\nsys.path.insert(0, str(REPO))\n")  # what it looks for
    assert not _edits_sys_path("code = 'sys.path.insert(0, site)'\n")


def test_triage_refuses_an_out_the_system_will_not_let_it_write(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A folder the OS refuses (a read-only folder for a user, a read-only mount for root)."""
    triage = _load_triage()

    def refuse(*args: object, **kwargs: object) -> object:
        raise PermissionError(13, "Permission denied", str(kept.parent))

    monkeypatch.setattr(triage.tempfile, "mkstemp", refuse)
    monkeypatch.setattr(triage, "collect", lambda first, last: pytest.fail("collected"))
    assert triage.main(["--out", str(kept)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [
        f"{TRIAGE_PROG}: error: --out {kept}: cannot write in {kept.parent}: Permission denied"
    ]
    _untouched(kept)


def test_triage_writes_its_table_atomically(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A write that fails at the last step (the rename) leaves the old table and no temp file."""
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    real_replace = Path.replace

    def fail(self: Path, target: Path) -> Path:
        raise OSError(28, "No space left on device", str(target))

    monkeypatch.setattr(Path, "replace", fail)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(kept)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(f"{TRIAGE_PROG}: error: "), err
    assert "No space left on device" in err[0]
    _untouched(kept)

    monkeypatch.setattr(Path, "replace", real_replace)
    kept.chmod(0o640)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(kept)]) == 0
    assert kept.read_text().startswith("# SM120 / SM121 changes upstream")
    assert stat.S_IMODE(kept.stat().st_mode) == 0o640  # the table keeps the mode it had
    assert sorted(p.name for p in kept.parent.iterdir()) == [kept.name]


def test_triage_reports_a_failed_download_in_one_line(tmp_path: Path, kept: Path) -> None:
    """No wheel in the cache and none on the index: pip's reason, one line, nothing written."""
    empty = tmp_path / "empty"
    empty.mkdir()
    offline = {
        "SGLPATCH_WHEEL_CACHE": str(empty),
        "PIP_NO_INDEX": "1",
        "PIP_FIND_LINKS": str(empty),
    }
    done = _run(TRIAGE, ["--from", "0.5.23", "--to", "0.5.24", "--out", str(kept)], offline)
    _assert_refused(
        done, TRIAGE_PROG, 1, "sglang 0.5.23", "pip download", "No matching distribution"
    )
    _untouched(kept)


# --- bench/run ---------------------------------------------------------------------------------

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
    done = _run(BENCH, ["--python", str(python)], {"TMPDIR": str(scratch)})
    _assert_refused(done, BENCH_PROG, 2, "--python", str(python), *words)
    assert list(scratch.iterdir()) == []


@pytest.mark.parametrize("rounds", ["x", "0", "-3"])
def test_bench_refuses_bad_rounds_in_one_line(scratch: Path, rounds: str) -> None:
    done = _run(BENCH, ["--rounds", rounds], {"TMPDIR": str(scratch)})
    _assert_refused(done, BENCH_PROG, 2, "--rounds")
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
    done = _run(BENCH, ["--python", str(listing)], env)
    _assert_refused(
        done, BENCH_PROG, 1, "pip download", "sglang==0.5.9", "No matching distribution"
    )
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


@pytest.mark.skipif(os.geteuid() != 0, reason="making a device node needs root")
def test_triage_writes_onto_a_device_and_never_replaces_it(
    kept: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--out /dev/full` replaced the device with a regular file (a rename over it)."""
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    full = kept.parent / "full"
    os.mknod(full, stat.S_IFCHR | 0o666, os.makedev(1, 7))  # Linux's /dev/full
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(full)]) == 1
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "No space left on device" in err[0], err
    assert stat.S_ISCHR(full.lstat().st_mode) and full.lstat().st_rdev == os.makedev(1, 7)


def test_triage_writes_through_a_symbolic_link(kept: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    triage = _load_triage()
    monkeypatch.setattr(triage, "collect", lambda first, last: [])
    link = kept.parent / "link.md"
    link.symlink_to(kept)
    assert triage.main(["--from", SEED, "--to", UPGRADE, "--out", str(link)]) == 0
    assert link.is_symlink() and kept.read_text().startswith("# SM120 / SM121 changes upstream")
