"""Installed plugins are found without waiting on a FIFO or reading without bound.

importlib.metadata opened every dist-info's `entry_points.txt` (and a plugin's `METADATA`) as it
came: a FIFO named so in any dist-info on `sys.path` hung every command that loads the catalogue.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch import entry_points

REPO = Path(__file__).resolve().parent.parent

PLUGIN = '''"""A plugin patch found by its entry point."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet

from sglpatch.patch import Patch


class Found(Patch):
    """Found, never run here."""

    id = "found-by-entry-point"
    description = "found"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release):
        return "srt/models/kimi_k25.py"

    def transform(self, module, release):
        return module

    def postcondition(self, module, release):
        pass
'''


def install(site: Path) -> Path:
    """`found_patches` 1.0, declaring one patch module in the `sglpatch.patches` group."""
    (site / "found_patches").mkdir(parents=True)
    (site / "found_patches" / "__init__.py").write_text("")
    (site / "found_patches" / "found.py").write_text(PLUGIN)
    info = site / "found_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: found-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sglpatch.patches]\nfound = found_patches.found\n")
    return info


def sglpatch(site: Path, *args: str) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)
    try:
        return subprocess.run(
            [sys.executable, "-m", "sglpatch", *args],
            capture_output=True, text=True, cwd=REPO, check=False, timeout=60,
            env={**os.environ, "PYTHONPATH": path},
        )  # fmt: skip
    except subprocess.TimeoutExpired:
        pytest.fail(f"sglpatch {' '.join(args)} waited on a FIFO")


def origins(run: subprocess.CompletedProcess[str]) -> dict[str, str]:
    assert run.returncode == 0, run.stderr
    return {p["id"]: p["origin"] for p in json.loads(run.stdout)["patches"]}


def test_a_fifo_for_entry_points_txt_is_skipped_with_a_warning(tmp_path: Path) -> None:
    site = tmp_path / "site"
    install(site)
    other = site / "other_tool-2.0.dist-info"
    other.mkdir()
    os.mkfifo(other / "entry_points.txt")
    run = sglpatch(site, "list", "--json")
    assert origins(run)["found-by-entry-point"] == "plugin found-patches"  # the rest still found
    assert run.stderr == (
        f"sglpatch: warning: ignoring {other / 'entry_points.txt'}: not a regular file; the "
        "plugins it declares are not loaded\n"
    )


def test_a_fifo_for_a_plugins_metadata_does_not_hang(tmp_path: Path) -> None:
    """Its name was read from METADATA; the dist-info's own name stands in."""
    info = install(tmp_path / "site")
    (info / "METADATA").unlink()
    os.mkfifo(info / "METADATA")
    run = sglpatch(tmp_path / "site", "list", "--json")
    assert origins(run)["found-by-entry-point"] == "plugin found_patches"
    assert run.stderr == ""


def test_an_oversize_entry_points_txt_is_skipped(tmp_path: Path) -> None:
    info = install(tmp_path / "site")
    with (info / "entry_points.txt").open("a") as text:
        text.truncate(entry_points.ENTRY_POINTS_LIMIT + 1)  # sparse: no disk spent
    run = sglpatch(tmp_path / "site", "list", "--json")
    assert "found-by-entry-point" not in origins(run)
    assert "larger than 1 MB; the plugins it declares are not loaded" in run.stderr
