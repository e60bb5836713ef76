"""The README's container lines, run as written against a checkout-shaped tree (no image built).

The "image" is a virtual environment of this test run's Python whose pip has an editable install
of a tagged checkout at <workspace>/sglang, as SGLang's images install /sgl-workspace/sglang.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.releases import SEED
from tests.test_discovery import BACKEND, PYPROJECT
from tests.test_target import git, make_checkout

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parent.parent
README = (REPO / "README.md").read_text()


def block(name: str) -> list[str]:
    """The lines of the README's code block marked `<!-- example: name -->`."""
    match = re.search(rf"<!-- example: {name} -->\n```\w*\n(.*?)```", README, re.S)
    assert match is not None, name
    return [line for line in match.group(1).splitlines() if line and not line.startswith("#")]


def sh(line: str, cwd: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, check=False
    )


def test_the_dockerfile_and_entrypoint_lines(tmp_path: Path) -> None:
    dockerfile = block("dockerfile")
    entrypoint = block("entrypoint")
    workdir = next(line.split()[1] for line in dockerfile if line.startswith("WORKDIR "))
    assert workdir == "/sgl-workspace"
    workspace = tmp_path / "sgl-workspace"  # stands in for WORKDIR

    # The image: SGLang's checkout, installed in editable mode into the image's Python.
    checkout = make_checkout(SEED, workspace / "sglang")
    (checkout / "python" / "pyproject.toml").write_text(PYPROJECT)
    (checkout / "python" / "editable_backend.py").write_text(BACKEND)
    image = tmp_path / "image"
    subprocess.run([sys.executable, "-m", "venv", image], check=True)
    pip = [str(image / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index"]
    subprocess.run([*pip, "--no-deps", "--no-build-isolation", "-e", checkout / "python"],
                   check=True)  # fmt: skip
    # sglpatch's dependencies are already in this test run's environment: let the image see them
    # so that the README's `pip install` needs no network for them.
    (Path(sysconfig.get_paths(vars={"base": str(image)})["purelib"]) / "deps.pth").write_text(
        sysconfig.get_paths()["purelib"] + "\n"
    )
    env = {**os.environ, "PATH": f"{image / 'bin'}{os.pathsep}{os.environ['PATH']}"}

    for line in dockerfile:
        instruction, _, argument = line.partition(" ")
        if instruction == "COPY":
            source, dest = argument.split()
            assert source == "."  # the build context: this repository
            shutil.copytree(REPO, workspace / dest, ignore=shutil.ignore_patterns(
                ".git", ".venv", ".cache", "build", "*.egg-info", "__pycache__"))  # fmt: skip
        elif instruction == "RUN":
            done = sh(argument, workspace, env)
            assert done.returncode == 0, done.stdout + done.stderr
    patched = sorted(git(checkout, "diff", "--name-only").split())
    assert patched == sorted(f"python/{m}" for m in wheels.applied_targets(SEED))

    check = next(line for line in entrypoint if "status --check" in line)
    assert check == "sglpatch status --check || exit 1"
    done = sh(check, workspace, env)
    # in place: the patches applied and those upstream's code already fixes
    states = wheels.expected_states(SEED, "applied").values()
    ok = f"ok: {sum(s != 'not for this release' for s in states)} patch(es) in place"
    assert done.returncode == 0 and done.stdout.startswith(ok), done.stderr

    git(checkout, "checkout", "--", ".")  # a mounted or reinstalled checkout: the patch is gone
    done = sh(check, workspace, env)
    assert done.returncode == 1 and "not in place on SGLang 0.5.9" in done.stderr
