"""Finding SGLang from the current folder, as git finds its repository: a checkout (or a
site-packages) is found from inside it without --target, after the active environment.

The checkout is shaped like the official image's /sgl-workspace/sglang, built from the real 0.5.23
wheel; the CLI runs as its own process with no environment SGLang (conftest hides any real one).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch.errors import ExitCode, TargetError
from sglpatch.target import Layout, find_target
from tests.support import wheels
from tests.support.releases import NEWEST, SEED
from tests.test_target import make_checkout

pytestmark = pytest.mark.wheel

INSIDE = ["", "python", "python/sglang", "python/sglang/srt/layers"]


@pytest.fixture(scope="module")
def checkout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A git checkout of the newest release at <workspace>/sglang (python/sglang/...)."""
    return make_checkout(NEWEST, tmp_path_factory.mktemp("workspace") / "sglang")


def sglpatch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """The CLI as its console script runs it: the current folder is not on sys.path (with
    `python -m`, from python/ this interpreter itself would import the checkout's sglang)."""
    env = {**os.environ, "PYTHONSAFEPATH": "1"}
    return subprocess.run(
        [sys.executable, "-m", "sglpatch", *args],
        cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def how(checkout: Path, inside: str) -> str:
    return "the current folder" if not inside else f"the current folder's parent {checkout}"


@pytest.mark.parametrize("inside", INSIDE, ids=lambda p: p or "root")
def test_status_finds_the_checkout_from_inside_it(checkout: Path, inside: str) -> None:
    done = sglpatch("status", cwd=checkout / inside)
    assert done.returncode == 0, done.stderr
    assert f"target:  {checkout} (checkout)\n" in done.stdout
    assert f"release: {NEWEST} (from git tag v{NEWEST})" in done.stdout
    assert f"found:   by {how(checkout, inside)}\n" in done.stdout
    assert "  not applied " in done.stdout  # its patches are listed, as with --target


def test_apply_and_doctor_find_it_too(checkout: Path) -> None:
    layers = checkout / "python" / "sglang" / "srt" / "layers"
    done = sglpatch("apply", "--dry-run", cwd=layers)
    assert done.returncode == 0, done.stderr
    assert f"{len(wheels.applied_targets(NEWEST))} file(s) would change" in done.stderr
    assert "+++ b/python/sglang/" in done.stdout
    done = sglpatch("doctor", "--json", cwd=layers)
    assert done.returncode in (0, ExitCode.GAPS), done.stderr
    report = json.loads(done.stdout)
    assert report["target"] == str(checkout) and report["release"] == NEWEST
    assert report["found_by"] == how(checkout, "python/sglang/srt/layers")
    assert report["kernels"] is None  # a checkout with no environment known


def test_outside_any_tree_nothing_is_found(tmp_path: Path) -> None:
    done = sglpatch("status", cwd=tmp_path)
    assert done.returncode == ExitCode.TARGET
    assert "no SGLang found" in done.stderr and "none in the current folder or above it" in (
        done.stderr
    )
    assert len(done.stderr.strip().splitlines()) == 1


def test_target_still_chooses(checkout: Path, site_059: Path) -> None:
    done = sglpatch("status", "--target", str(site_059), cwd=checkout / "python" / "sglang")
    assert done.returncode == 0, done.stderr
    assert f"target:  {site_059} (site-packages)" in done.stdout
    assert "found:" not in done.stdout  # what the user typed needs no explanation


def _venv(prefix: Path) -> Path:
    """A real virtual environment of this Python; its site-packages is returned."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", prefix], check=True)
    (site,) = prefix.glob("lib/python3.*/site-packages")
    return site


def test_the_active_environment_wins_over_the_current_folder(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = _venv(tmp_path / "venv")
    wheels.site_packages(SEED, site, wheels.patch_targets(SEED))
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "venv"))
    done = sglpatch("status", cwd=checkout / "python" / "sglang" / "srt")
    assert done.returncode == 0, done.stderr
    assert f"target:  {site} (site-packages)" in done.stdout
    assert f"release: {SEED}" in done.stdout
    assert (
        f"found:   by $VIRTUAL_ENV at {tmp_path / 'venv'}; also found {checkout / 'python'} "
        f"(the current folder's parent {checkout})\n"
    ) in done.stdout


def test_the_current_folder_wins_over_this_python(
    checkout: Path, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(site_059))  # what this interpreter would import
    monkeypatch.chdir(checkout)
    found = find_target(None, None)
    assert (found.root, found.layout, found.found_by) == (
        checkout,
        Layout.CHECKOUT,
        "the current folder",
    )
    assert found.also_found == (f"{site_059} (this Python at {sys.prefix})",)


def test_a_tree_an_interpreter_also_imports_keeps_the_interpreters_name(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As an editable install of the image's checkout: python3 on PATH imports it through a
    `.pth`. Found from the checkout, it is still named by that environment (doctor reads that
    environment's kernels), once."""
    site = _venv(tmp_path / "image")
    (site / "__editable__.sglang.pth").write_text(f"{checkout / 'python'}\n")
    monkeypatch.setenv("PATH", f"{tmp_path / 'image' / 'bin'}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.chdir(checkout / "python" / "sglang")
    found = find_target(None, None)
    assert found.root == checkout and found.layout is Layout.CHECKOUT
    assert found.found_by == f"python3 on PATH at {tmp_path / 'image'}"
    assert found.also_found == ()


def test_a_site_packages_is_found_from_inside_it(
    site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(site_059 / "sglang" / "srt")
    found = find_target(None, None)
    assert (found.root, found.layout) == (site_059, Layout.SITE_PACKAGES)
    assert found.found_by == f"the current folder's parent {site_059}"
    assert str(found.release) == SEED
    monkeypatch.chdir(site_059)
    assert find_target(None, None).found_by == "the current folder"


def test_a_removed_current_folder_finds_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    gone = tmp_path / "gone"
    gone.mkdir()
    monkeypatch.chdir(gone)
    gone.rmdir()
    with pytest.raises(TargetError, match="no SGLang found"):
        find_target(None, None)


def test_a_folder_holding_a_checkout_is_not_inside_it(
    checkout: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The workspace above the checkout holds it but is no tree: only folders above the
    current one are searched, never those beside or below it."""
    monkeypatch.chdir(checkout.parent)
    with pytest.raises(TargetError, match="no SGLang found"):
        find_target(None, None)
