"""End to end through the CLI on the real SGLang 0.5.9 wheel."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import wheels
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
