"""doctor with the kernel wheels beside SGLang: what cannot run on 12.x blocks, and apply cannot
fix it (the kernels' own reader is tested in tests/test_kernels_*.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import NEWEST, SEED
from tests.test_kernels_packages import NEW_TARGETS, env_with, site, stand_in

pytestmark = pytest.mark.wheel
__all__ = ["site"]  # the fixture: 0.5.9's kernel wheels in miniature


@pytest.fixture
def environment(site: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The real SGLang 0.5.9 beside those kernels, with a CUDA 13 nvcc for FlashInfer's JIT."""
    wheels.site_packages(SEED, site, wheels.patch_targets(SEED))
    for name, value in env_with(tmp_path).items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("TRITON_PTXAS_PATH", raising=False)
    return site


def doctor_json(runner: CliRunner, site: Path) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["doctor", "--target", str(site), "--json"])
    return result.exit_code, json.loads(result.stdout)


def kernel_blockers(data: dict[str, object]) -> list[str]:
    blockers = data["blockers"]
    assert isinstance(blockers, list)
    return sorted(
        str(b["what"]).split(" ")[0] for b in blockers if b["source"] == "the installed kernels"
    )


def test_kernels_that_do_not_run_on_12_1_block_and_apply_cannot_fix_them(
    runner: CliRunner, environment: Path
) -> None:
    code, data = doctor_json(runner, environment)
    assert code == ExitCode.GAPS and data["ready"] is False
    assert kernel_blockers(data) == ["sgl-kernel", "triton"]
    kernels = {k["package"]: k for k in data["kernels"]}  # type: ignore[union-attr]
    assert kernels["sgl-kernel"]["runs_on"] == {"12.0": True, "12.1": False}
    assert kernels["torch"]["runs_on"] == {"12.0": True, "12.1": True}
    assert all(
        b["fixed_by"] is None for b in data["blockers"] if b["source"] == "the installed kernels"
    )  # type: ignore[union-attr, index]

    assert api.apply(environment, None).written  # every patch in place: the kernels remain
    code, data = doctor_json(runner, environment)
    assert code == ExitCode.GAPS and kernel_blockers(data) == ["sgl-kernel", "triton"]
    assert "none fixed by `sglpatch apply`" in str(data["verdict"])
    text = runner.invoke(app, ["doctor", "--target", str(environment)]).stdout
    assert "triton 3.5.1 does not run on 12.1" in text
    assert "`sglpatch apply` cannot fix it; fix: set TRITON_PTXAS_PATH" in text
    # the short report counts the kernels read; --verbose shows each package
    assert "Kernels: 8 installed packages read, 3 without code for some capability-12 part" in text
    assert "Kernels (the compiled packages beside SGLang" not in text
    verbose = runner.invoke(app, ["doctor", "--target", str(environment), "--verbose"]).stdout
    assert "Kernels (the compiled packages beside SGLang" in verbose


def test_the_fix_it_names_clears_the_blocker(
    runner: CliRunner, environment: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    ptxas = stand_in(tmp_path / "cuda-12.9/bin/ptxas", "12.9", NEW_TARGETS)
    monkeypatch.setenv("TRITON_PTXAS_PATH", str(ptxas))
    code, data = doctor_json(runner, environment)
    assert code == ExitCode.GAPS and kernel_blockers(data) == ["sgl-kernel"]


def test_without_kernel_packages_nothing_blocks_and_they_are_named(
    runner: CliRunner, site_059: Path
) -> None:
    result = runner.invoke(app, ["doctor", "--target", str(site_059)])
    assert "Kernels not installed beside this SGLang (not judged): torch, sgl-kernel" in (
        result.stdout
    )
    data = json.loads(runner.invoke(app, ["doctor", "--target", str(site_059), "--json"]).stdout)
    assert kernel_blockers(data) == []
    assert {k["runs_on"]["12.1"] for k in data["kernels"]} == {None}


def test_a_checkout_is_judged_in_the_environment_that_found_it(tmp_path: Path) -> None:
    """An editable install: the kernels are those of the venv that discovery asked."""
    import dataclasses

    from packaging.version import Version

    from sglpatch.doctor.environment import site_packages
    from sglpatch.target import Layout, Target

    site = tmp_path / "venv" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    checkout = Target(tmp_path / "sglang", Layout.CHECKOUT, Version(SEED), "tag v0.5.9", None, ())
    assert site_packages(checkout) is None  # given by --target: no environment is known
    found = dataclasses.replace(checkout, found_by=f"$VIRTUAL_ENV at {tmp_path / 'venv'}")
    assert site_packages(found) == site
    installed = Target(site, Layout.SITE_PACKAGES, Version(SEED), "METADATA", None, ())
    assert site_packages(installed) == site


def test_the_sgl_kernel_fix_names_what_was_read_not_remembered_wheels(
    runner: CliRunner, environment: Path
) -> None:
    """It cited "the PyPI wheels of sgl-kernel 0.3.21 and sglang-kernel 0.4.1 carry sm_120a
    only", whatever was installed (the aarch64 wheels carry sm_121a)."""
    _, data = doctor_json(runner, environment)
    (sgl,) = [k for k in data["kernels"] if k["package"] == "sgl-kernel"]  # type: ignore[union-attr]
    assert "PyPI" not in sgl["fix"] and "0.4.1" not in sgl["fix"]
    assert sgl["fix"] == (
        "an sgl-kernel whose common_ops has sm_121a or sm_120f code, built with CUDA 12.9+ "
        "(the installed sgl_kernel/sm100/common_ops.abi3.so carries sm_90a sm_100a sm_120a)"
    )


def test_one_capability_asked_shows_that_part_alone(runner: CliRunner, environment: Path) -> None:
    """`--capability 12.0` printed "12.1 not judged" on every kernel line."""
    args = ["doctor", "--target", str(environment), "--capability", "12.0"]
    text = runner.invoke(app, [*args, "--verbose"]).stdout
    kernels = text[text.index("\nKernels") :]
    assert "12.0 runs" in kernels and "12.1" not in kernels, kernels
    text = runner.invoke(app, args).stdout
    assert "1 without code for 12.0 (--verbose shows each)" in text, text


def test_counts_of_one_are_singular(runner: CliRunner, tmp_path: Path) -> None:
    """It said "1 capability gates in 1 files" (the newest release's patch targets have one)."""
    tree = wheels.site_packages(NEWEST, tmp_path / "site", wheels.patch_targets(NEWEST))
    text = runner.invoke(app, ["doctor", "--target", str(tree)]).stdout
    # Two gates now: 0.5.23's DSA default (overrides.py:716) and its bf16 sibling, one file.
    assert "Suspects (not blockers): 2 capability gates in 1 file where" in text, text
    assert "Not judged: 1 gate gives" in text and "Not listed: 1 place that refuses" in text
