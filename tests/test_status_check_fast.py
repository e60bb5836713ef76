"""`status --check` answers from hashes where the ledger vouches for a file, and loads libcst only
where it cannot: the verdict is always the one running every codemod gives."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api, catalogue, engine
from sglpatch.cli import app
from sglpatch.results import AlreadyApplied, NotApplicable
from sglpatch.store import Ledger, default_directory
from sglpatch.target import find_target
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
# libcst is imported on first use (sglpatch.lazy): its code has run only if its nodes are loaded.
LIBCST_RAN = "libcst._nodes.module"
# What apply does on SEED, patch by patch, as `list --release` predicts it.
APPLIES = [r.id for r in api.list_patches(SEED) if r.outlook == "applies"]
UPSTREAM = [r.id for r in api.list_patches(SEED) if r.effect == "already upstream"]


def full_verdict(site: Path) -> tuple[set[str], set[str]]:
    """(in place, missing) as every codemod in memory says: what `status --check` said before."""
    target = find_target(site, None, required=False)
    release = target.release
    assert release is not None
    state = Ledger(default_directory()).record(target).state()
    same = state.release == str(release)
    patches = [p for p in catalogue.load() if not (same and p.id in state.skipped)]
    plan = engine.plan(target, patches, release, state.patches if same else ())
    in_place = {o.patch_id for o in plan.outcomes if isinstance(o, AlreadyApplied)}
    missing = {
        o.patch_id for o in plan.outcomes if not isinstance(o, (AlreadyApplied, NotApplicable))
    }
    return in_place, missing


def check_in_a_process(site: Path) -> tuple[int, str, list[str]]:
    """`status --check` in a fresh Python: its exit code, its stdout and the modules it loaded."""
    code = (
        "import sys, json\n"
        "from sglpatch.cli import app\n"
        f"try:\n    app(['status', '--check', '--target', {str(site)!r}])\n"
        "except SystemExit as done:\n    code = done.code\n"
        "print(json.dumps([code, sorted(sys.modules)]), file=sys.stderr)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=dict(os.environ)
    )
    exit_code, modules = json.loads(done.stderr.splitlines()[-1])
    return exit_code, done.stdout, modules


def assert_same_verdict(site: Path) -> api.CheckReport:
    report = api.check(site)
    in_place, missing = full_verdict(site)
    assert set(report.in_place) == in_place and {m.id for m in report.missing} == missing
    return report


def test_a_tree_the_ledger_vouches_for_never_loads_libcst(site_059: Path) -> None:
    api.apply(site_059, None)
    code, out, modules = check_in_a_process(site_059)
    assert code == 0 and out.startswith("ok: "), out
    assert LIBCST_RAN not in modules and not [m for m in modules if m.startswith("libcst.")]
    report = assert_same_verdict(site_059)
    assert list(report.applied) == APPLIES and list(report.upstream) == UPSTREAM


def test_an_edited_file_gets_the_codemods(site_059: Path) -> None:
    api.apply(site_059, None)
    sizes = site_059 / SIZES
    sizes.write_bytes(sizes.read_bytes() + b"# a local note\n")  # the change is still there
    code, out, modules = check_in_a_process(site_059)
    assert code == 0 and LIBCST_RAN in modules, out
    assert_same_verdict(site_059)

    sizes.write_bytes(wheels.member(SEED, SIZES))  # the wheel's bytes: the change is gone
    code, _, modules = check_in_a_process(site_059)
    assert code == 1 and LIBCST_RAN in modules
    report = assert_same_verdict(site_059)
    assert [m.id for m in report.missing] == ["sm120-symm-mem-sizes"]


def test_no_ledger_and_a_tree_patched_by_hand_get_the_codemods(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    code, _, modules = check_in_a_process(site_059)  # no ledger, nothing applied
    assert code == 1 and LIBCST_RAN in modules
    report = assert_same_verdict(site_059)
    assert [m.id for m in report.missing] == APPLIES

    diff = runner.invoke(app, ["apply", "--dry-run", "--target", str(site_059)]).stdout
    by_hand = wheels.site_packages(SEED, tmp_path / "by-hand", wheels.patch_targets(SEED))
    tool = ["patch", "-p1", "--quiet"] if shutil.which("patch") else ["git", "apply"]
    subprocess.run(tool, input=diff.encode(), cwd=by_hand, check=True)
    code, out, modules = check_in_a_process(by_hand)
    assert code == 0 and LIBCST_RAN in modules, out
    report = assert_same_verdict(by_hand)
    assert not report.missing and list(report.applied) == APPLIES
