"""Finding SGLang without --target, in real environments made here from this test run's Python.

Each environment is a real `python -m venv` of the same base Python as sglpatch's own (the usual
case that once hid the user's environment), with the real sglang 0.5.9 wheel installed by pip
from the wheel cache (`--no-deps --no-index`: never from the network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode, TargetError
from sglpatch.target import Layout, _isolated_pipx, find_target
from tests.conftest import snapshot
from tests.support import fifos, wheels
from tests.support.releases import SEED
from tests.test_target import git, make_checkout

pytestmark = pytest.mark.wheel

# The checkout's python/ is built by a PEP 660 backend of our own (no setuptools or wheel needed
# offline): its editable wheel holds a `.pth` naming the checkout, as setuptools' editable
# installs of a plain layout do.
PYPROJECT = """\
[build-system]
requires = []
build-backend = "editable_backend"
backend-path = ["."]

[project]
name = "sglang"
version = "0.5.9"
"""

BACKEND = """\
import base64, hashlib, os, zipfile

DIST = "sglang-0.5.9.dist-info"


def _line(name, data):
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_editable(wheel_directory, config_settings=None, metadata_directory=None):
    here = os.path.dirname(os.path.abspath(__file__))
    files = {
        "__editable__.sglang-0.5.9.pth": (here + "\\n").encode(),
        DIST + "/METADATA": b"Metadata-Version: 2.1\\nName: sglang\\nVersion: 0.5.9\\n",
        DIST + "/WHEEL": b"Wheel-Version: 1.0\\nGenerator: test\\nRoot-Is-Purelib: true\\nTag: py3-none-any\\n",
    }
    name = "sglang-0.5.9-py3-none-any.whl"
    with zipfile.ZipFile(os.path.join(wheel_directory, name), "w") as archive:
        for member, data in files.items():
            archive.writestr(member, data)
        record = [_line(m, d) for m, d in files.items()] + [DIST + "/RECORD,,"]
        archive.writestr(DIST + "/RECORD", "\\n".join(record) + "\\n")
    return name


def get_requires_for_build_editable(config_settings=None):
    return []


def build_wheel(wheel_directory, config_settings=None, metadata_directory=None):
    raise NotImplementedError("only editable installs")


def build_sdist(sdist_directory, config_settings=None):
    raise NotImplementedError("only editable installs")
"""


class Envs(NamedTuple):
    venv: Path  # a virtual environment with the sglang wheel installed
    # A conda-shaped prefix: conda-meta/, bin/python, lib/python3.X/site-packages. Its python is
    # a venv's (a real conda Python would need its own standard library), which is all that
    # discovery relies on: the interpreter in $CONDA_PREFIX/bin answers where sglang is.
    conda: Path
    editable: Path  # a virtual environment with an editable install of `checkout`
    checkout: Path  # a git checkout shaped like the sglang repository, tagged v0.5.9


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    result = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, check=False
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _site(prefix: Path) -> Path:
    (site,) = prefix.glob("lib/python3.*/site-packages")
    return site


def _install_wheel(prefix: Path) -> None:
    _run(sys.executable, "-m", "pip", "--python", prefix / "bin" / "python", "install",
         "--quiet", "--no-deps", "--no-index", "--no-compile", wheels.wheel(SEED))  # fmt: skip


@pytest.fixture(scope="module")
def envs(tmp_path_factory: pytest.TempPathFactory) -> Envs:
    base = tmp_path_factory.mktemp("envs")
    venv, conda, editable = base / "venv", base / "conda", base / "editable"
    for prefix in (venv, conda):
        _run(sys.executable, "-m", "venv", "--without-pip", prefix)
        _install_wheel(prefix)
    (conda / "conda-meta").mkdir()
    (conda / "conda-meta" / "history").write_text("==> 2026-11-30 <==\n")
    checkout = make_checkout(SEED, base / "sgl-workspace" / "sglang")
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT)
    (checkout / "python" / "editable_backend.py").write_text(BACKEND)
    _run(sys.executable, "-m", "venv", "--without-pip", editable)
    _run(sys.executable, "-m", "pip", "--python", editable / "bin" / "python", "install",
         "--quiet", "--no-deps", "--no-index", "--no-build-isolation", "-e", checkout / "python")  # fmt: skip
    return Envs(venv, conda, editable, checkout)


def status(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["status", *args])
    return result.exit_code, result.stdout, result.stderr


def test_the_environments_share_sglpatchs_base_python(envs: Envs) -> None:
    # The case that defeated `Path(python3).resolve() == Path(sys.executable).resolve()`.
    assert (envs.venv / "bin" / "python3").resolve() == Path(sys.executable).resolve()
    with pytest.raises(TargetError, match="no SGLang found"):
        find_target(None, None)  # nothing active, nothing importable: the tests' own baseline


def test_the_active_virtual_environment(
    envs: Envs, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", str(envs.venv))
    code, out, err = status(runner)
    assert code == 0, err
    assert f"target:  {_site(envs.venv)} (site-packages)" in out
    assert f"found:   by $VIRTUAL_ENV at {envs.venv}\n" in out
    assert "release: 0.5.9" in out
    result = runner.invoke(app, ["apply", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    changes = len(wheels.applied_targets(SEED))
    assert "+    12: {" in result.stdout and f"{changes} file(s) would change" in result.stderr


def test_python3_on_path_of_an_environment_made_from_the_same_python(
    envs: Envs, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", f"{envs.venv / 'bin'}{os.pathsep}{os.environ['PATH']}")
    code, out, err = status(runner)
    assert code == 0, err
    assert f"target:  {_site(envs.venv)} (site-packages)" in out
    assert f"found:   by python3 on PATH at {envs.venv}\n" in out


def test_the_active_conda_prefix(
    envs: Envs, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CONDA_PREFIX", str(envs.conda))
    code, out, err = status(runner)
    assert code == 0, err
    assert f"target:  {_site(envs.conda)} (site-packages)" in out
    assert f"found:   by $CONDA_PREFIX at {envs.conda}\n" in out


def test_an_editable_install_resolves_to_the_checkout_and_is_patched_there(
    envs: Envs, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", str(envs.editable))
    code, out, err = status(runner)
    assert code == 0, err
    assert f"target:  {envs.checkout} (checkout)" in out
    assert "release: 0.5.9 (from git tag v0.5.9)" in out
    site = snapshot(_site(envs.editable))
    pristine = snapshot(envs.checkout / "python" / "sglang")
    result = runner.invoke(app, ["apply"])
    assert result.exit_code == 0, result.stderr
    changed = git(envs.checkout, "diff", "--name-only").split()
    assert sorted(changed) == sorted(f"python/{m}" for m in wheels.applied_targets(SEED))
    assert snapshot(_site(envs.editable)) == site  # the install's own files are untouched
    assert runner.invoke(app, ["revert"]).exit_code == 0
    assert snapshot(envs.checkout / "python" / "sglang") == pristine


def test_the_first_found_is_used_and_the_others_named_in_one_line(
    envs: Envs, runner: CliRunner, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("VIRTUAL_ENV", str(envs.venv))
    monkeypatch.setenv("CONDA_PREFIX", str(envs.conda))
    monkeypatch.setenv("PATH", f"{envs.editable / 'bin'}{os.pathsep}{os.environ['PATH']}")
    result = runner.invoke(app, ["apply", "--dry-run"])
    assert result.exit_code == 0, result.stderr
    also = [line for line in result.stderr.splitlines() if "also found" in line]
    assert len(also) == 1
    assert also[0] == (
        f"sglpatch: using {_site(envs.venv)} ($VIRTUAL_ENV at {envs.venv}); also found "
        f"{_site(envs.conda)} ($CONDA_PREFIX at {envs.conda}), "
        f"{envs.checkout / 'python'} (python3 on PATH at {envs.editable}); --target chooses"
    )
    _, out, _ = status(runner)
    assert f"found:   by $VIRTUAL_ENV at {envs.venv}; also found {_site(envs.conda)}" in out
    data = json.loads(status(runner, "--json")[1])
    assert data["found_by"] == f"$VIRTUAL_ENV at {envs.venv}" and len(data["also_found"]) == 2


def test_this_python_comes_before_python3_on_path(envs: Envs, site_059: Path) -> None:
    # This interpreter imports site_059's sglang (on its sys.path only, not in PYTHONPATH,
    # which python3 would inherit); python3 on PATH is the venv's.
    code = (
        f"import sys; sys.path.insert(0, {str(site_059)!r}); from sglpatch.cli import main; main()"
    )
    env = {**os.environ, "PATH": f"{envs.venv / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    out = subprocess.run(
        [sys.executable, "-c", code, "status"], capture_output=True, text=True, env=env, check=True
    ).stdout
    assert f"target:  {site_059} (site-packages)" in out
    assert f"found:   by this Python at {sys.prefix}; also found {_site(envs.venv)}" in out


@pytest.mark.parametrize(
    ("which", "layout"),
    [
        ("venv", Layout.SITE_PACKAGES),
        ("conda", Layout.SITE_PACKAGES),
        ("editable", Layout.CHECKOUT),
    ],
)
def test_target_may_be_an_environment_root(envs: Envs, which: str, layout: Layout) -> None:
    prefix = getattr(envs, which)
    found = find_target(prefix, None)
    assert found.layout is layout and found.release is not None and str(found.release) == SEED
    assert found.root == (envs.checkout if layout is Layout.CHECKOUT else _site(prefix))
    assert found.found_by is None  # what the user typed needs no explanation


def test_an_environment_without_sglang_is_named(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "env" / "lib" / "python3.11" / "site-packages").mkdir(parents=True)
    code, _, err = status(runner, "--target", str(tmp_path / "env"))
    assert code == ExitCode.TARGET and "environment without SGLang" in err


def test_an_isolated_pipx_environment_is_not_asked(
    tmp_path: Path, site_059: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    prefix = tmp_path / "pipx" / "venvs" / "sglpatch"
    prefix.mkdir(parents=True)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = false\n")
    monkeypatch.setattr(sys, "prefix", str(prefix))
    monkeypatch.syspath_prepend(str(site_059))  # what this interpreter would import
    assert find_target(None, None).found_by == f"this Python at {prefix}"  # not made by pipx
    (prefix / "pipx_metadata.json").write_text("{}")
    assert _isolated_pipx(prefix)
    with pytest.raises(TargetError, match="no SGLang found"):
        find_target(None, None)
    (prefix / "pyvenv.cfg").write_text("home = /usr/bin\ninclude-system-site-packages = true\n")
    assert find_target(None, None).root == site_059  # it sees the system's packages


def test_a_pipx_environment_whose_pyvenv_cfg_is_a_fifo_does_not_hang(tmp_path: Path) -> None:
    """As one that cannot be read: isolated (what this Python imports is not asked)."""
    prefix = tmp_path / "pipx" / "venvs" / "sglpatch"
    prefix.mkdir(parents=True)
    (prefix / "pipx_metadata.json").write_text("{}")
    os.mkfifo(prefix / "pyvenv.cfg")
    assert fifos.without_waiting(prefix / "pyvenv.cfg", lambda: _isolated_pipx(prefix))
