"""`list`, and what happens on a release the catalogue was not tested on."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.conftest import snapshot
from tests.support import wheels

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"


def test_list_shows_each_patch_with_its_releases(runner: CliRunner) -> None:
    result = runner.invoke(app, ["list"])
    assert result.exit_code == 0
    for patch_id in (
        "sm120-symm-mem-sizes",
        "sm120-symm-mem-two-shot",
        "kimi-k25-eagle3-interface",
    ):
        assert f"{patch_id}  [built-in]" in result.stdout
    assert "tested: <=0.5.23,>=0.5.3" in result.stdout
    assert "upstream since 0.5.14" in result.stdout and "upstream since 0.5.10" in result.stdout


@pytest.mark.parametrize(
    ("release", "outlooks"),
    [
        ("0.5.8", ["on 0.5.8: applies", "on 0.5.8: not for this release"]),
        ("0.5.12", ["on 0.5.12: applies", "on 0.5.12: already upstream (fixed in 0.5.10)"]),
        ("0.5.99", ["on 0.5.99: refused: untested"]),
    ],
)
def test_list_for_a_release(runner: CliRunner, release: str, outlooks: list[str]) -> None:
    result = runner.invoke(app, ["list", "--release", release])
    assert result.exit_code == 0
    assert all(o in result.stdout for o in outlooks), result.stdout


def _newer(tmp_path: Path, version: str = "0.5.24") -> Path:
    """The newest real release, relabelled as one the catalogue has never seen."""
    site = wheels.site_packages("0.5.23", tmp_path / "site", wheels.patch_targets("0.5.23"))
    (site / "sglang" / "_version.py").unlink()
    for info in site.glob("sglang-*.dist-info"):
        metadata = info / "METADATA"
        metadata.write_text(metadata.read_text().replace("Version: 0.5.23", f"Version: {version}"))
    return site


@pytest.mark.wheel
def test_an_untested_release_is_refused_unless_forced(runner: CliRunner, tmp_path: Path) -> None:
    site = _newer(tmp_path)
    before = snapshot(site)
    result = runner.invoke(app, ["apply", "--target", str(site)])
    assert result.exit_code == ExitCode.REFUSED
    assert result.stderr == (  # the tested range once, lower bound first (it was per patch)
        "sglpatch: error: SGLang 0.5.24 is untested (the patches are tested on >=0.5.3,<=0.5.23); "
        "--force runs the codemods anyway\n"
    )
    assert snapshot(site) == before

    result = runner.invoke(app, ["apply", "--target", str(site), "--force"])
    assert result.exit_code == 0, result.stderr
    assert "running untested patches" in result.stderr
    assert "applied               sm120-symm-mem-sizes" in result.stdout
    changed = [k for k, v in snapshot(site).items() if before[k] != v]
    assert SIZES in changed and changed == wheels.applied_targets("0.5.23")


@pytest.mark.wheel
def test_forced_codemods_still_refuse_without_their_anchor(
    runner: CliRunner, tmp_path: Path
) -> None:
    site = _newer(tmp_path, "0.6.0")
    sizes = site / SIZES
    sizes.write_bytes(
        sizes.read_bytes().replace(b"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES", b"SYMM_MEM_SIZES")
    )
    before = snapshot(site)
    result = runner.invoke(app, ["apply", "--target", str(site), "--force"])
    assert result.exit_code == ExitCode.TARGET
    assert "expected one assignment to TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES" in result.stderr
    assert snapshot(site) == before


def test_an_untested_refusal_names_each_range_once() -> None:
    """23 patches with one range made a line of about 1,700 characters; ranges that differ (a
    plugin's) are each named once, with how many patches share it."""
    from types import SimpleNamespace
    from typing import Any, cast

    from packaging.specifiers import SpecifierSet
    from packaging.version import Version

    from sglpatch.api.common import untested_refusal

    def patch(id_: str, tested: str) -> Any:
        return SimpleNamespace(id=id_, tested=SpecifierSet(tested))

    patches = [patch(f"p{i}", ">=0.5.3,<=0.5.23") for i in range(23)] + [patch("mine", "==0.5.9")]
    line = untested_refusal(Version("0.5.24"), cast(Any, patches))
    assert line == (
        "SGLang 0.5.24 is untested (tested: >=0.5.3,<=0.5.23 (p0 and 22 more); ==0.5.9 (mine)); "
        "--force runs the codemods anyway"
    )
