"""What users install: the wheel's contents, pip and pipx in fresh environments, completion,
colour on a terminal."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.releases import SEED

REPO = Path(__file__).resolve().parent.parent
# One patch per module in patches/, its id the module name with dashes.
BUILT_INS = {
    p.stem.replace("_", "-") for p in (REPO / "patches").glob("*.py") if p.stem != "__init__"
}


def run(*args: str | Path, env: dict[str, str] | None = None, **kwargs: object) -> str:
    result = subprocess.run(
        [str(a) for a in args],
        capture_output=True,
        text=True,
        env=env or dict(os.environ),
        **kwargs,
    )  # type: ignore[call-overload]
    assert result.returncode == 0, result.stderr
    return str(result.stdout)


@pytest.fixture(scope="module")
def built_wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    run(sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "-w", out, REPO)
    (found,) = out.glob("sglpatch-*.whl")
    return found


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory: pytest.TempPathFactory, built_wheel: Path) -> Path:
    venv = tmp_path_factory.mktemp("venv") / "v"
    run(sys.executable, "-m", "venv", venv)
    run(venv / "bin" / "python", "-m", "pip", "install", "--quiet", built_wheel)
    return venv


@pytest.mark.wheel
def test_the_wheel_ships_one_package_with_its_patches(built_wheel: Path) -> None:
    with zipfile.ZipFile(built_wheel) as archive:
        names = archive.namelist()
        metadata = archive.read(next(n for n in names if n.endswith("dist-info/METADATA"))).decode()
        entry_points = archive.read(
            next(n for n in names if n.endswith("entry_points.txt"))
        ).decode()
    top_level = {n.split("/")[0] for n in names}
    assert {t for t in top_level if not t.endswith(".dist-info")} == {"sglpatch"}
    assert "sglpatch/py.typed" in names
    assert {f"sglpatch/patches/{i.replace('-', '_')}.py" for i in BUILT_INS} <= set(names)
    assert "sglpatch = sglpatch.__main__:main" in entry_points
    for field in ("Requires-Dist: libcst", "Requires-Dist: typer", "Requires-Dist: GitPython",
                  "Requires-Dist: packaging", "Classifier: Typing :: Typed", "Requires-Python: >=3.10"):  # fmt: skip
        assert field in metadata


@pytest.mark.wheel
def test_pip_install_in_a_fresh_environment(fresh_venv: Path, tmp_path: Path) -> None:
    sglpatch = fresh_venv / "bin" / "sglpatch"
    assert run(sglpatch, "--version").startswith("sglpatch 0.1.0")
    listed = json.loads(run(sglpatch, "list", "--json"))
    assert {p["id"] for p in listed["patches"]} == BUILT_INS
    site = wheels.site_packages(SEED, tmp_path / "site", wheels.patch_targets(SEED))
    env = {**os.environ, "SGLPATCH_LEDGER": str(tmp_path / "ledger")}
    assert "+    12: {" in run(sglpatch, "apply", "--dry-run", "--target", site, env=env)


@pytest.mark.wheel
def test_pipx_install_finds_the_users_sglang_through_python3(
    fresh_venv: Path, tmp_path: Path
) -> None:
    run(fresh_venv / "bin" / "python", "-m", "pip", "install", "--quiet", "pipx")
    env = {**os.environ, "PIPX_HOME": str(tmp_path / "pipx"), "PIPX_BIN_DIR": str(tmp_path / "bin")}
    run(fresh_venv / "bin" / "pipx", "install", "--quiet", REPO, env=env)
    sglpatch = tmp_path / "bin" / "sglpatch"
    assert {p["id"] for p in json.loads(run(sglpatch, "list", "--json"))["patches"]} == BUILT_INS

    # The user's environment: python3 on PATH imports an sglang the pipx venv cannot see.
    site = wheels.site_packages(SEED, tmp_path / "user-site", wheels.patch_targets(SEED))
    user_bin = tmp_path / "user-bin"
    user_bin.mkdir()
    (user_bin / "python3").write_text(f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n')
    (user_bin / "python3").chmod(0o755)
    env["PATH"] = f"{user_bin}:{os.environ['PATH']}"
    env["SGLPATCH_LEDGER"] = str(tmp_path / "ledger")
    status = json.loads(run(sglpatch, "status", "--json", env=env))
    assert status["target"] == str(site) and status["release"] == SEED
    assert status["found_by"].startswith("python3 on PATH at ")


@pytest.mark.wheel
def test_the_readme_first_command_works_before_pipx_bin_is_on_path(
    fresh_venv: Path, tmp_path: Path
) -> None:
    """A first-time pipx user: pipx just installed (its own venv), its bin folder not on PATH,
    sglang 0.5.9 in the active virtual environment. The README's line, run by sh as written."""
    from tests.test_readme import FIRST_COMMAND

    run(fresh_venv / "bin" / "python", "-m", "pip", "install", "--quiet", "pipx")
    user_venv = tmp_path / "user-venv"
    site = user_venv / "lib" / "python3.11" / "site-packages"
    wheels.site_packages(SEED, site, wheels.patch_targets(SEED))
    (user_venv / "bin").mkdir()
    (user_venv / "bin" / "python").write_text(
        f'#!/bin/sh\nPYTHONPATH={site} exec {sys.executable} "$@"\n'
    )
    (user_venv / "bin" / "python").chmod(0o755)
    home = tmp_path / "home"
    env = {
        "HOME": str(home),
        "PATH": f"{fresh_venv / 'bin'}:/usr/bin:/bin",  # pipx, not its bin folder
        "VIRTUAL_ENV": str(user_venv),
        "SGLPATCH_LEDGER": str(tmp_path / "ledger"),
        "PIP_CACHE_DIR": os.environ.get("PIP_CACHE_DIR", str(home / ".cache" / "pip")),
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    done = subprocess.run(
        ["sh", "-c", FIRST_COMMAND], cwd=REPO, env=env, capture_output=True, text=True, check=False
    )
    assert done.returncode == 0, done.stderr
    assert "+    12: {" in done.stdout and "nothing was written" in done.stderr
    assert (home / ".local" / "bin").as_posix() not in env["PATH"]


@pytest.mark.wheel
def test_shell_completion(fresh_venv: Path) -> None:
    sglpatch = fresh_venv / "bin" / "sglpatch"
    # `--show-completion` names the shell it runs under (shellingham walks the process tree):
    # run it from bash, as users do, not from whatever started the test session (`; true`
    # keeps bash from exec-ing the command in its own place).
    assert "_SGLPATCH_COMPLETE" in run("bash", "-c", f"'{sglpatch}' --show-completion; true")
    env = {
        **os.environ,
        "_SGLPATCH_COMPLETE": "complete_bash",
        "COMP_WORDS": "sglpatch ap",
        "COMP_CWORD": "1",
    }
    assert run(sglpatch, env=env).split() == ["apply"]


@pytest.mark.wheel
@pytest.mark.parametrize("no_color", [False, True])
def test_colour_only_on_a_terminal_without_no_color(site_059: Path, no_color: bool) -> None:
    env = {k: v for k, v in os.environ.items() if k != "NO_COLOR"}
    env["TERM"] = "xterm"
    if no_color:
        env["NO_COLOR"] = "1"
    leader, follower = pty.openpty()
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "apply", "--dry-run", "--target", str(site_059)],
        stdout=follower, stderr=subprocess.DEVNULL, env=env,
    )  # fmt: skip
    os.close(follower)
    output = b""
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:
            break
        if not chunk:
            break
        output += chunk
    process.wait()
    os.close(leader)
    assert process.returncode == 0
    assert (b"\x1b[" in output) is not no_color
    assert b"+    12: {" in output
