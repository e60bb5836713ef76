"""An editable install as the target: an environment whose site-packages holds no `sglang/`, only
pip's record (`direct_url.json`) or a `.pth` naming a checkout's `python/`, as SGLang's images and
developers install it. `--target` on the environment or its site-packages leads to the checkout,
and doctor reads that environment: its kernels, and whether SGLang's requirements are there.

The checkout is the real newest release's, tagged; the environment is a folder shaped as one
(`lib/python3.11/site-packages`), or a real virtual environment where its interpreter is asked.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.target import Layout, find_target
from tests.support import wheels
from tests.support.releases import NEWEST
from tests.test_target import make_checkout

pytestmark = pytest.mark.wheel

ENVIRONMENT = "the environment"


@pytest.fixture
def checkout(tmp_path: Path) -> Path:
    return make_checkout(NEWEST, tmp_path / "sglang")


def environment(prefix: Path, checkout: Path, *, record: bool = True) -> Path:
    """An environment folder with SGLang installed editable from `checkout`: pip's dist-info
    (the wheel's METADATA, a `direct_url.json`) when `record`, a bare `.pth` otherwise.
    Returns its site-packages."""
    site = prefix / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    if record:
        info = site / f"sglang-{NEWEST}.dist-info"
        info.mkdir()
        metadata = wheels.member(NEWEST, f"sglang-{NEWEST}.dist-info/METADATA")
        (info / "METADATA").write_bytes(metadata)
        url = (checkout / "python").as_uri()
        (info / "direct_url.json").write_text(
            json.dumps({"url": url, "dir_info": {"editable": True}})
        )
        # setuptools' strict editable mode: a finder, whose `.pth` line is code (never run)
        (site / f"__editable__.sglang-{NEWEST}.pth").write_text("import __editable___finder; x\n")
    else:
        (site / "sglang.pth").write_text(f"{checkout / 'python'}\n")
    return site


def invoke(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.mark.parametrize("record", [True, False], ids=["direct_url", "pth"])
def test_the_site_packages_or_the_environment_leads_to_the_checkout(
    checkout: Path, tmp_path: Path, record: bool
) -> None:
    """--target on the site-packages said "not an SGLang tree", exit 3."""
    site = environment(tmp_path / "env", checkout, record=record)
    for given in (site, tmp_path / "env"):
        target = find_target(given, None)
        assert (target.root, target.layout) == (checkout, Layout.CHECKOUT), given
        assert target.environment == site.resolve()
        assert str(target.release) == NEWEST


def test_doctor_reads_the_kernels_and_requirements_of_that_environment(
    runner: CliRunner, checkout: Path, tmp_path: Path
) -> None:
    """It said "Kernels: not judged (... --target set to the site-packages ...)", and that
    site-packages was refused; without torch it said "ready"."""
    site = environment(tmp_path / "env", checkout)
    code, out, _ = invoke(runner, "doctor", "--json", "--target", str(site))
    report = json.loads(out)
    assert report["kernels"] is not None and report["kernels_from"] == str(site.resolve())
    assert code == ExitCode.GAPS and report["ready"] is False
    missing = {b["what"].split(" ")[0]: b for b in report["blockers"] if b["source"] == ENVIRONMENT}
    torch = wheels.member(NEWEST, f"sglang-{NEWEST}.dist-info/METADATA").decode()
    pinned = next(
        line.split(": ", 1)[1]
        for line in torch.splitlines()
        if line.startswith("Requires-Dist: torch==")
    )
    assert "torch" in missing and missing["torch"]["fixed_by"] is None
    assert f"requires {pinned}" in missing["torch"]["what"]  # read from SGLang's METADATA
    assert missing["torch"]["note"].endswith(f"-m pip install '{pinned}'")
    code, out, _ = invoke(runner, "doctor", "--target", str(tmp_path / "env"))
    assert "torch is not installed in the environment at" in out
    assert (
        f"`sglpatch apply` cannot fix it; fix: {tmp_path / 'env' / 'bin' / 'python'} -m pip" in out
    )
    assert "Kernels: not judged" not in out


def test_a_bare_pth_still_needs_torch(runner: CliRunner, checkout: Path, tmp_path: Path) -> None:
    site = environment(tmp_path / "env", checkout, record=False)
    code, out, _ = invoke(runner, "doctor", "--json", "--target", str(site))
    report = json.loads(out)
    assert code == ExitCode.GAPS
    (torch,) = [b for b in report["blockers"] if b["source"] == ENVIRONMENT]
    assert (
        torch["what"].startswith("torch is not installed") and "SGLang imports it" in torch["what"]
    )
    (site / "torch-2.9.1.dist-info").mkdir()  # installed: no longer a blocker
    (site / "torch-2.9.1.dist-info" / "METADATA").write_text("Name: torch\nVersion: 2.9.1\n")
    report = json.loads(invoke(runner, "doctor", "--json", "--target", str(site))[1])
    assert [b for b in report["blockers"] if b["source"] == ENVIRONMENT] == []


def test_a_real_environment_is_asked_through_its_interpreter(
    runner: CliRunner, checkout: Path, tmp_path: Path
) -> None:
    """A virtual environment: its interpreter says where sglang is, and which requirements it
    finds (none of SGLang's here: a bare venv)."""
    prefix = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", prefix], check=True)
    (site,) = prefix.glob("lib/python3.*/site-packages")
    (site / "sglang.pth").write_text(f"{checkout / 'python'}\n")
    target = find_target(prefix, None)
    assert target.root == checkout and target.environment == site.resolve()
    code, out, _ = invoke(runner, "doctor", "--target", str(prefix))
    assert code == ExitCode.GAPS
    assert f"torch is not installed in the environment at {prefix}" in out


def test_a_plain_site_packages_folder_is_not_judged_for_requirements(
    runner: CliRunner, site_059: Path
) -> None:
    """`pip install --target` folders go on PYTHONPATH beside others: what they lack may be
    elsewhere, so only an environment's site-packages is judged."""
    report = json.loads(invoke(runner, "doctor", "--json", "--target", str(site_059))[1])
    assert [b for b in report["blockers"] if b["source"] == ENVIRONMENT] == []


def test_an_environment_with_only_python3_is_asked_through_it(
    runner: CliRunner, checkout: Path, tmp_path: Path
) -> None:
    """Debian's /usr/local has `bin/python3` and no `bin/python`: only `bin/python` was asked,
    so what that interpreter finds elsewhere was called "not installed", and the fix named an
    interpreter that does not exist."""
    site = environment(tmp_path / "env", checkout)
    python3 = tmp_path / "env" / "bin" / "python3"
    python3.parent.mkdir(parents=True, exist_ok=True)
    python3.write_text(
        "#!/bin/sh\n# stands for an interpreter that finds every name it is asked for\n"
        'shift 2; for n in "$@"; do echo "$n"; done\n'
    )
    python3.chmod(0o755)
    report = json.loads(invoke(runner, "doctor", "--json", "--target", str(site))[1])
    assert [b for b in report["blockers"] if b["source"] == ENVIRONMENT] == []
    python3.write_text("#!/bin/sh\nexit 0\n")  # finds nothing: the fix names python3
    report = json.loads(invoke(runner, "doctor", "--json", "--target", str(site))[1])
    (torch,) = [b for b in report["blockers"] if b["what"].startswith("torch ")]
    assert f"{python3} -m pip install" in torch["note"]


def test_a_relative_pth_line_is_relative_to_its_folder(
    checkout: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """It was taken relative to the current folder: the target depended on where one stood."""
    site = tmp_path / "env" / "lib" / "python3.11" / "site-packages"
    site.mkdir(parents=True)
    (site / "sglang.pth").write_text(f"{os.path.relpath(checkout / 'python', site)}\n")
    monkeypatch.chdir(tmp_path)
    assert find_target(site, None).root == checkout
