"""End to end through the CLI on the real SGLang 0.5.9 wheel."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import fifos, wheels
from tests.support.releases import SEED, UPGRADE

pytestmark = pytest.mark.wheel

TARGETS = wheels.patch_targets(SEED)
CHANGED = wheels.applied_targets(SEED)  # TARGETS less the files whose fix is upstream
# The patches apply applies there (two may share a file: counted apart from CHANGED).
APPLIES = [row.id for row in api.list_patches(SEED) if row.outlook == "applies"]
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
KIMI = "sglang/srt/models/kimi_k25.py"


def run(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_dry_run_shows_the_diff_and_writes_nothing(
    runner: CliRunner, site_059: Path, ledger_dir: Path, tmp_path: Path
) -> None:
    before = snapshot(site_059)
    code, out, err = run(runner, "apply", "--release", SEED, "--target", str(site_059), "--dry-run")
    assert code == 0, err
    assert snapshot(site_059) == before
    assert not ledger_dir.exists()
    assert sorted(
        line.split()[2][2:] for line in out.splitlines() if line.startswith("diff --git")
    ) == sorted(CHANGED)
    assert (
        "+    12: {" in out
        and "+        12: []," in out
        and "+    def get_embed_and_head(self):" in out
    )
    assert "\x1b[" not in out  # no colour off a terminal
    assert f"{len(CHANGED)} file(s) would change" in err

    # The diff is exactly what apply writes: `git apply` of it on a copy gives the same bytes.
    copy = wheels.site_packages(SEED, tmp_path / "copy", TARGETS)
    subprocess.run(["git", "apply", "-"], input=out.encode(), cwd=copy, check=True)
    code, _, err = run(runner, "apply", "--target", str(site_059))
    assert code == 0, err
    assert snapshot(copy) == snapshot(site_059)


def test_apply_then_revert_restores_the_wheel_bytes(
    runner: CliRunner, site_059: Path, ledger_dir: Path
) -> None:
    pristine = snapshot(site_059)
    code, out, err = run(runner, "apply", "--release", SEED, "--target", str(site_059))
    assert code == 0, err
    after = snapshot(site_059)
    assert sorted(k for k in pristine if pristine[k] != after[k]) == sorted(CHANGED)
    assert set(after) == set(pristine)
    assert f"Patched {len(CHANGED)} file(s)" in out
    assert ledger_dir in Path(out.split("recorded in ")[1].split(" (commit")[0]).parents

    code, out, _ = run(runner, "apply", "--release", SEED, "--target", str(site_059))
    assert code == 0 and "Nothing to do" in out and out.count("  already applied ") == len(APPLIES)
    assert snapshot(site_059) == after

    code, out, _ = run(runner, "status", "--target", str(site_059))
    assert code == 0
    assert (
        out.count("  applied ") == len(APPLIES)
        and "release: 0.5.9" in out
        and str(ledger_dir) in out
    )

    code, out, err = run(runner, "revert", "--target", str(site_059))
    assert code == 0, err
    assert snapshot(site_059) == pristine
    for member in TARGETS:  # byte for byte what the wheel ships
        assert (site_059 / member).read_bytes() == wheels.member(SEED, member)

    code, out, _ = run(runner, "revert", "--target", str(site_059))
    assert code == 0 and "Nothing to revert" in out

    code, out, _ = run(runner, "log", "--target", str(site_059))
    lines = out.splitlines()
    assert (
        len(lines) == 2
        and "revert:" in lines[0]
        and "apply:" in lines[1]
        and "SGLang 0.5.9" in lines[1]
    )


def test_the_ledger_commit_holds_both_versions_of_every_file(
    runner: CliRunner, site_059: Path
) -> None:
    pristine = snapshot(site_059)
    run(runner, "apply", "--target", str(site_059))
    history = api.log(site_059)
    record, message = history.ledger, history.entries[0].message
    assert "release: 0.5.9" in message and "sglpatch: " in message
    assert all(
        p in message
        for p in ("sm120-symm-mem-sizes", "sm120-symm-mem-two-shot", "kimi-k25-eagle3-interface")
    )
    for member in CHANGED:
        assert (record / "files" / "original" / member).read_bytes() == pristine[member]
        assert (record / "files" / "patched" / member).read_bytes() == (
            site_059 / member
        ).read_bytes()
    show = subprocess.run(
        ["git", "-C", str(record), "show", "--name-only", "--format=", "HEAD"],
        capture_output=True, text=True, check=True,
    ).stdout.split()  # fmt: skip
    assert sorted(show) == sorted(
        ["state.json", "target.json"]
        + [f"files/{k}/{m}" for k in ("original", "patched") for m in CHANGED]
    )


def test_an_edit_after_apply_blocks_revert_until_forced(runner: CliRunner, site_059: Path) -> None:
    pristine = snapshot(site_059)
    run(runner, "apply", "--target", str(site_059))
    edited = site_059 / SIZES
    edited.write_bytes(edited.read_bytes() + b"# my own tuning\n")
    before = snapshot(site_059)

    code, out, err = run(runner, "status", "--target", str(site_059))
    assert "edited since applied" in out

    code, _, err = run(runner, "revert", "--target", str(site_059))
    assert code == ExitCode.REFUSED
    assert SIZES in err and "--force" in err and len(err.strip().splitlines()) == 1
    assert snapshot(site_059) == before

    code, out, err = run(runner, "revert", "--force", "--target", str(site_059))
    assert code == 0, err
    assert snapshot(site_059) == pristine
    record = api.log(site_059).ledger
    assert (record / "files" / "edited" / SIZES).read_bytes().endswith(b"# my own tuning\n")


@pytest.mark.parametrize(
    ("args", "code", "words"),
    [
        (["--release", UPGRADE], ExitCode.REFUSED, [UPGRADE, SEED]),
        (["--release", "zero.five"], ExitCode.USAGE, ["zero.five"]),
    ],
)
def test_release_problems(
    runner: CliRunner, site_059: Path, args: list[str], code: int, words: list[str]
) -> None:
    before = snapshot(site_059)
    exit_code, _, err = run(runner, "apply", "--target", str(site_059), *args)
    assert exit_code == code
    assert all(w in err for w in words) and len(err.strip().splitlines()) == 1
    assert snapshot(site_059) == before


def test_unknown_release_asks_for_it(runner: CliRunner, site_059: Path) -> None:
    for path in site_059.glob("sglang-*.dist-info"):
        (path / "METADATA").unlink()
    (site_059 / "sglang" / "_version.py").unlink()
    code, _, err = run(runner, "apply", "--target", str(site_059))
    assert code == ExitCode.USAGE and "pass --release" in err
    code, _, err = run(runner, "apply", "--target", str(site_059), "--release", SEED, "--dry-run")
    assert code == 0, err


def test_target_problems(runner: CliRunner, tmp_path: Path) -> None:
    code, _, err = run(runner, "status", "--target", str(tmp_path / "nope"))
    assert code == ExitCode.TARGET and "no such file" in err
    code, _, err = run(runner, "apply", "--target", str(tmp_path))
    assert code == ExitCode.TARGET and "not an SGLang tree" in err
    assert "Traceback" not in err


def test_a_broken_file_stops_everything(
    runner: CliRunner, site_059: Path, ledger_dir: Path
) -> None:
    kimi = site_059 / KIMI
    kimi.write_bytes(
        kimi.read_bytes().replace(
            b"class KimiK25ForConditionalGeneration(nn.Module):",
            b"class KimiK25ForConditionalGeneration(nn.Module)",
        )
    )
    before = snapshot(site_059)
    code, _, err = run(runner, "apply", "--target", str(site_059))
    assert code == ExitCode.TARGET
    assert KIMI in err and "syntax error" in err and "nothing was written" in err
    assert snapshot(site_059) == before and not (ledger_dir / "targets").exists()


def test_a_lost_anchor_stops_everything(runner: CliRunner, site_059: Path) -> None:
    sizes = site_059 / SIZES
    sizes.write_bytes(
        sizes.read_bytes().replace(b"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", b"RENAMED_TABLE")
    )
    before = snapshot(site_059)
    code, _, err = run(runner, "apply", "--target", str(site_059))
    assert code == ExitCode.TARGET and "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in err
    assert snapshot(site_059) == before


def test_the_package_folder_itself_is_a_target(runner: CliRunner, site_059: Path) -> None:
    code, out, _ = run(runner, "status", "--target", str(site_059 / "sglang"))
    assert code == 0 and f"target:  {site_059} (site-packages)" in out


def test_modes_are_kept_and_stale_bytecode_dropped(runner: CliRunner, site_059: Path) -> None:
    sizes = site_059 / SIZES
    sizes.chmod(0o640)
    cache = sizes.parent / "__pycache__"
    cache.mkdir()
    stale = [
        cache / "all_reduce_utils.cpython-311.pyc",
        cache / "all_reduce_utils.cpython-312.opt-1.pyc",
    ]
    other = cache / "all_reduce_utils_extra.cpython-311.pyc"
    for pyc in (*stale, other):
        pyc.write_bytes(b"stale")
    run(runner, "apply", "--target", str(site_059))
    assert sizes.stat().st_mode & 0o777 == 0o640
    assert not any(p.exists() for p in stale) and other.exists()
    assert not list(sizes.parent.glob(".*.sglpatch"))  # no staging files left


def test_ledger_location_flags(
    runner: CliRunner, site_059: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chosen = tmp_path / "chosen"
    code, out, _ = run(runner, "apply", "--target", str(site_059), "--ledger", str(chosen))
    assert code == 0 and str(chosen) in out
    assert (chosen / "README.md").exists() and len(list((chosen / "targets").iterdir())) == 1
    monkeypatch.setenv("SGLPATCH_LEDGER", str(chosen))
    code, out, _ = run(runner, "status", "--target", str(site_059))
    assert out.count("  applied ") == len(APPLIES)
    code, _, err = run(
        runner, "revert", "--target", str(site_059), "--ledger", str(site_059 / "ledger")
    )
    assert code == ExitCode.REFUSED and "inside the target" in err


def test_an_internal_error_is_one_line_with_a_log(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, isolated: Path
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(api, "status", boom)
    code, _, err = run(runner, "status")
    assert code == ExitCode.BUG
    assert "internal error: RuntimeError: kaboom" in err and len(err.strip().splitlines()) == 1
    log = Path(err.split("details in ")[1].rstrip(")\n"))
    assert "Traceback" in log.read_text()


def _python(code: str, env: dict[str, str] | None = None) -> str:
    return subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **(env or {})},
    ).stdout


# libcst is imported on first use (sglpatch.lazy): its code has run only if its nodes are loaded.
# importlib.metadata is never loaded: sglpatch.entry_points reads the entry points itself.
HEAVY = ("libcst._nodes.module", "git", "importlib.metadata")


def test_the_cli_and_status_load_neither_libcst_nor_git(site_059: Path) -> None:
    loaded = json.loads(
        _python("import sys, json, sglpatch.cli; print(json.dumps(sorted(sys.modules)))")
    )
    assert not [m for m in HEAVY if m in loaded]
    code = (
        "import sys, json\n"
        "from sglpatch.cli import app\n"
        f"try:\n    app(['status', '--target', {str(site_059)!r}])\n"
        "except SystemExit:\n    pass\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    modules = json.loads(_python(code).splitlines()[-1])
    assert "sglpatch.patches.kimi_k25_eagle3_interface" in modules  # the catalogue was read
    assert not [m for m in HEAVY if m in modules]


def test_without_target_the_importable_sglang_is_found(site_059: Path, tmp_path: Path) -> None:
    out = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status"], capture_output=True, text=True,
        env={**os.environ, "PYTHONPATH": str(site_059)}, check=True,
    ).stdout  # fmt: skip
    assert f"target:  {site_059} (site-packages)" in out

    # A pipx-style install: not importable here, but python3 on PATH sees it.
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python3 = bin_dir / "python3"
    python3.write_text(f'#!/bin/sh\nPYTHONPATH={site_059} exec {sys.executable} "$@"\n')
    python3.chmod(0o755)
    out = subprocess.run(
        [sys.executable, "-m", "sglpatch", "status"], capture_output=True, text=True,
        env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}, check=True,
    ).stdout  # fmt: skip
    assert f"target:  {site_059} (site-packages)" in out


def test_nothing_found_without_target(runner: CliRunner) -> None:
    code, _, err = run(runner, "status")
    assert code == ExitCode.TARGET and "--target" in err


def test_help_and_version(runner: CliRunner) -> None:
    code, out, _ = run(runner, "--help")
    assert code == 0 and all(c in out for c in ("apply", "revert", "status", "log", "list"))
    code, out, _ = run(runner, "apply", "--help")
    assert code == 0 and "--dry-run" in out and "--target" in out and "--ledger" in out
    code, out, _ = run(runner, "--version")
    assert code == 0 and out.startswith("sglpatch ")


def test_a_closed_output_pipe_is_not_a_crash(site_059: Path) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "apply", "--dry-run", "--target", str(site_059)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert process.stdout is not None and process.stderr is not None
    process.stdout.close()  # like `| head` that has read enough
    err = process.stderr.read().decode()
    assert process.wait() == ExitCode.BROKEN_PIPE
    assert "Traceback" not in err and "internal error" not in err


@pytest.mark.parametrize("stdout", [">&-", ">/dev/full"])
def test_a_finished_apply_with_stdout_closed_or_full_exits_0(site_059: Path, stdout: str) -> None:
    """The change happened: that its report could not be printed is no failure."""
    command = f"{shlex.quote(sys.executable)} -m sglpatch apply --target {site_059} {stdout}"
    result = subprocess.run(["sh", "-c", command], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "internal error" not in result.stderr and "Traceback" not in result.stderr
    states = {row.id: row.state for row in api.status(site_059).patches}
    assert states == wheels.expected_states(SEED, "applied")
    dry = command.replace(" apply ", " status ")
    assert subprocess.run(["sh", "-c", dry], check=False).returncode in (0, ExitCode.BROKEN_PIPE)


# Interrupts this process once, when libcst (loaded lazily, on the first parse) is half imported.
TRIP = """
import importlib.abc, os, signal, sys
class Trip(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name == "libcst._batched_visitor":  # the first thing libcst imports
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, Trip())
from sglpatch.cli import main
sys.argv = ["sglpatch", *sys.argv[1:]]
main()
"""


def test_ctrl_c_while_libcst_imports_is_an_interrupt(site_059: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRIP, "apply", "--dry-run", "--target", str(site_059)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == ExitCode.INTERRUPTED, result.stderr
    assert result.stderr.strip() == "sglpatch: error: interrupted"


# What the `sglpatch` console script does (load its entry point, call it), with Ctrl-C while
# the CLI itself (typer first) is importing.
TRIP_CLI = TRIP.replace("libcst._batched_visitor", "typer").replace(
    "from sglpatch.cli import main",
    "from importlib.metadata import entry_points\n"
    "(script,) = entry_points(group='console_scripts', name='sglpatch')\n"
    "main = script.load()",
)


def test_ctrl_c_while_the_cli_imports_is_an_interrupt(site_059: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", TRIP_CLI, "status", "--target", str(site_059)],
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert result.returncode == ExitCode.INTERRUPTED, result.stderr
    assert result.stderr.strip() == "sglpatch: error: interrupted"


def test_the_crash_log_goes_to_the_ledger_in_use(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, ledger_dir: Path
) -> None:
    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(api, "status", boom)
    code, _, err = run(runner, "status", "--ledger", str(tmp_path / "mine"))
    assert code == ExitCode.BUG
    assert f"details in {tmp_path / 'mine' / 'sglpatch-crash.log'}" in err
    assert "kaboom" in (tmp_path / "mine" / "sglpatch-crash.log").read_text()
    assert not (ledger_dir / "sglpatch-crash.log").exists()


@pytest.mark.parametrize("kind", ["fifo", "symlink"])
def test_a_crash_log_that_is_no_file_is_not_written(
    runner: CliRunner, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, kind: str
) -> None:
    """A FIFO there made the error's report wait for a reader; a symbolic link (the log falls
    back to the shared TMPDIR) appended the traceback to the file it names."""

    def boom(*args: object, **kwargs: object) -> None:
        raise RuntimeError("kaboom")

    monkeypatch.setattr(api, "status", boom)
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    (tmp_path / "mine").mkdir()
    log = tmp_path / "mine" / "sglpatch-crash.log"
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    os.mkfifo(log) if kind == "fifo" else log.symlink_to(victim)
    code, _, err = fifos.without_waiting(
        log, lambda: run(runner, "status", "--ledger", str(tmp_path / "mine"))
    )
    assert code == ExitCode.BUG
    assert f"details in {tmp_path / 'tmp' / 'sglpatch-crash.log'}" in err
    assert "kaboom" in (tmp_path / "tmp" / "sglpatch-crash.log").read_text()
    assert victim.read_text() == "mine\n"
