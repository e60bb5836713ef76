"""Nothing sglpatch writes lands outside the target's package or over the target or the ledger.

Hostile or buggy patches (a plugin whose target_file climbs out, a symlinked folder in the tree)
and a careless `export --output` are refused with nothing written.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import catalogue
from sglpatch.catalogue import CatalogueError
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED, UPGRADE

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"

# A plugin patch that edits whatever file TARGET names: it appends a line to it.
PLUGIN = '''"""A test plugin: appends a marker line to the file it names."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import AlreadyPresent, Patch


class Marker(Patch):
    """Appends `# marker`."""

    id = "marker"
    description = "appends a marker"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release: Version) -> str | None:
        return {where}

    def transform(self, module, release):  # type: ignore[no-untyped-def]
        if module.code.endswith("# marker\\n"):
            raise AlreadyPresent("marked")
        import libcst as cst

        return cst.parse_module(module.code + "# marker\\n")

    def postcondition(self, module, release):  # type: ignore[no-untyped-def]
        pass
'''


def plugin(folder: Path, where: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "marker.py").write_text(PLUGIN.replace("{where}", where))
    return folder


def everything(root: Path) -> dict[str, bytes]:
    return snapshot(root)


@pytest.mark.parametrize(
    "where",
    [
        '"../../outside.py"',
        '"srt/../../../outside.py"',
        "__import__('os').path.abspath('outside.py')",
        '"/etc/hostname"',
        '"srt//x.py"',
    ],
)
def test_a_patch_path_that_leaves_the_package_is_refused_at_load(
    runner: CliRunner, tmp_path: Path, where: str
) -> None:
    site = wheels.site_packages(SEED, tmp_path / "site", [KIMI])
    (tmp_path / "outside.py").write_text("x = 1\n")
    catalog = plugin(tmp_path / "plugins", where)
    before = everything(tmp_path)
    for command in ("apply", "status", "list"):
        args = [command, "--catalog", str(catalog)]
        args += [] if command == "list" else ["--target", str(site)]
        result = runner.invoke(app, args)
        assert result.exit_code == ExitCode.USAGE, (command, result.stdout, result.stderr)
        assert "target_file names" in result.stderr and "marker" in result.stderr
    assert everything(tmp_path) == before


def test_a_path_that_leaves_only_on_some_release_is_refused_at_plan_time(
    runner: CliRunner, tmp_path: Path
) -> None:
    """target_file depends on the release: the load-time probe cannot see every one."""
    site = wheels.site_packages(SEED, tmp_path / "site", [KIMI])
    (tmp_path / "outside.py").write_text("x = 1\n")
    where = f'"../../outside.py" if release == Version("{SEED}") else "srt/models/kimi_k25.py"'
    catalog = plugin(tmp_path / "plugins", where)
    assert "marker" in {p.id for p in catalogue.load(catalog)}  # 0.5.3 probes fine
    before = everything(tmp_path)
    for args in (["apply"], ["apply", "--dry-run"], ["status"]):
        result = runner.invoke(app, [*args, "--target", str(site), "--catalog", str(catalog)])
        assert result.exit_code == ExitCode.USAGE, (args, result.stdout, result.stderr)
        assert "'../../outside.py'" in result.stderr and "nothing was written" in result.stderr
    result = runner.invoke(
        app, ["export", "-V", SEED, "-o", "-", "-t", str(site), "--catalog", str(catalog)]
    )
    assert result.exit_code == ExitCode.USAGE
    assert everything(tmp_path) == before
    marker = next(p for p in catalogue.load(catalog) if p.id == "marker")
    with pytest.raises(CatalogueError, match=r"'\.\.' part"):
        marker.package_file(Version(SEED))
    assert marker.package_file(Version(UPGRADE)) == "srt/models/kimi_k25.py"


def test_a_symlinked_folder_in_the_tree_is_not_written_through(
    runner: CliRunner, tmp_path: Path
) -> None:
    site = wheels.site_packages(SEED, tmp_path / "site", wheels.patch_targets(SEED))
    models = site / "sglang" / "srt" / "models"
    elsewhere = tmp_path / "elsewhere"
    models.rename(elsewhere)
    models.symlink_to(elsewhere, target_is_directory=True)
    before = everything(tmp_path)
    result = runner.invoke(app, ["apply", "--target", str(site)])
    assert result.exit_code == ExitCode.TARGET, result.stdout
    assert "sglang/srt/models is a symbolic link to a directory" in result.stdout + result.stderr
    assert everything(tmp_path) == before


@pytest.mark.parametrize("inside", ["target", "ledger"])
def test_export_never_writes_into_the_target_or_the_ledger(
    runner: CliRunner, site_059: Path, tmp_path: Path, inside: str
) -> None:
    ledger = tmp_path / "ledger"
    applied = runner.invoke(app, ["apply", "--target", str(site_059), "--ledger", str(ledger)])
    assert applied.exit_code == 0, applied.stderr
    output = site_059 / KIMI if inside == "target" else ledger / "README.md"
    before = {**everything(site_059), **everything(ledger)}
    result = runner.invoke(
        app,
        ["export", "-V", SEED, "-t", str(site_059), "--ledger", str(ledger), "-o", str(output)],
    )
    assert result.exit_code == ExitCode.REFUSED, result.stdout
    assert f"inside the {inside}" in result.stderr
    assert {**everything(site_059), **everything(ledger)} == before


def test_a_patch_added_on_top_of_ours_keeps_the_first_original(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    """Two applies on one file: revert must still find the pristine bytes, not the middle ones."""
    pristine = snapshot(site_059)
    assert runner.invoke(app, ["apply", "--target", str(site_059)]).exit_code == 0
    sizes = "srt/distributed/device_communicators/all_reduce_utils.py"
    catalog = plugin(tmp_path / "plugins", repr(sizes))
    result = runner.invoke(app, ["apply", "--target", str(site_059), "--catalog", str(catalog)])
    assert result.exit_code == 0 and "Patched 1 file(s)" in result.stdout, result.stderr
    result = runner.invoke(app, ["revert", "--target", str(site_059)])
    assert result.exit_code == 0, result.stderr
    assert snapshot(site_059) == pristine


def test_revert_does_not_write_through_a_folder_made_a_symlink_since(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    assert runner.invoke(app, ["apply", "--target", str(site_059)]).exit_code == 0
    models = site_059 / "sglang" / "srt" / "models"
    elsewhere = tmp_path / "elsewhere"
    models.rename(elsewhere)
    models.symlink_to(elsewhere, target_is_directory=True)
    before = everything(tmp_path)
    result = runner.invoke(app, ["revert", "--force", "--target", str(site_059)])
    assert result.exit_code == ExitCode.REFUSED, result.stdout
    assert "sglang/srt/models is now a symbolic link" in result.stderr
    assert everything(tmp_path) == before
