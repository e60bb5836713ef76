"""Finding the target and its release, on every layout docs/commands.md names."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import RefusedError, TargetError, UsageError
from sglpatch.target import Layout, detect_release, find_target, parse_release
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

USER = {"GIT_AUTHOR_NAME": "u", "GIT_AUTHOR_EMAIL": "u@x", "GIT_COMMITTER_NAME": "u"}


def git(repo: Path, *args: str) -> str:
    env = {**os.environ, **USER, "GIT_COMMITTER_EMAIL": "u@x"}
    return subprocess.run(
        ["git", "-C", str(repo), *args], capture_output=True, text=True, check=True, env=env
    ).stdout


def make_checkout(release: str, root: Path) -> Path:
    """A git checkout shaped like the sglang repository (python/sglang/...), tagged v<release>."""
    staging = wheels.site_packages(release, root.parent / "staging", wheels.patch_targets(release))
    (root / "python").mkdir(parents=True)
    (staging / "sglang").rename(root / "python" / "sglang")
    (root / "python" / "sglang" / "_version.py").unlink(missing_ok=True)  # generated at build time
    (root / "README.md").write_text("sglang\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "release")
    git(root, "tag", f"v{release}")
    return root


@pytest.mark.wheel
def test_release_sources(tmp_path: Path) -> None:
    site = wheels.site_packages(SEED, tmp_path / "site")
    assert detect_release(site, Layout.SITE_PACKAGES)[0] == Version(SEED)
    for info in site.glob("sglang-*.dist-info"):
        (info / "METADATA").unlink()
    found, source = detect_release(site, Layout.SITE_PACKAGES)
    assert found == Version(SEED) and source and source.endswith("_version.py")
    old = wheels.site_packages("0.5.3", tmp_path / "old")
    for info in old.glob("sglang-*.dist-info"):
        (info / "METADATA").unlink()
    found, source = detect_release(old, Layout.SITE_PACKAGES)
    assert found == Version("0.5.3") and source and source.endswith("version.py")


@pytest.mark.wheel
def test_checkout_release_comes_from_its_tag(tmp_path: Path) -> None:
    root = make_checkout(SEED, tmp_path / "sglang")
    target = find_target(root, None)
    assert target.layout is Layout.CHECKOUT and target.release == Version(SEED)
    assert target.release_source == "git tag v0.5.9"
    assert find_target(root / "python", None).root == root
    assert find_target(root / "python" / "sglang", None).root == root
    (root / "python" / "sglang" / "x.py").write_text("")
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "after the release")
    # past the tag: still that release, as `git describe` says (tests/test_release_past_tag.py)
    assert find_target(root, None).release == Version(SEED)
    git(root, "tag", "-d", f"v{SEED}")
    with pytest.raises(UsageError, match="pass --release"):
        find_target(root, None)


@pytest.mark.wheel
def test_version_mismatch_names_both(tmp_path: Path) -> None:
    site = wheels.site_packages(SEED, tmp_path / "site")
    with pytest.raises(RefusedError, match=r"0\.5\.8.*0\.5\.9"):
        find_target(site, Version("0.5.8"))


def test_not_sglang(tmp_path: Path) -> None:
    (tmp_path / "sglang").mkdir()
    with pytest.raises(TargetError, match="not an SGLang tree"):
        find_target(tmp_path, None)
    (tmp_path / "file").write_text("")
    with pytest.raises(TargetError, match="not a directory"):
        find_target(tmp_path / "file", None)
    with pytest.raises(UsageError):
        parse_release("latest")


@pytest.mark.wheel
def test_a_checkout_keeps_the_users_git_state(tmp_path: Path) -> None:
    runner = CliRunner()
    root = make_checkout(SEED, tmp_path / "sglang")
    (root / "README.md").write_text("sglang, edited\n")
    git(root, "stash", "-q")
    git(root, "branch", "feature")
    (root / "notes.txt").write_text("mine\n")
    git(root, "add", "notes.txt")  # a staged change of the user's own

    def git_state() -> tuple[str, ...]:
        return (
            git(root, "rev-parse", "HEAD"),
            git(root, "branch", "--list"),
            git(root, "stash", "list"),
            git(root, "show-ref"),
            git(root, "ls-files", "--stage"),
        )

    state = git_state()
    index = (root / ".git" / "index").read_bytes()
    pristine = snapshot(root / "python")
    result = runner.invoke(app, ["apply", "--version", SEED, "--target", str(root)])
    assert result.exit_code == 0, result.stderr
    assert "checkout" in result.stdout
    assert (root / ".git" / "index").read_bytes() == index  # not even its stat cache
    assert git_state() == state
    changed = git(root, "diff", "--name-only").split()
    applied = wheels.applied_targets(SEED)
    assert sorted(changed) == sorted(f"python/{m}" for m in applied)

    result = runner.invoke(app, ["status", "--target", str(root)])
    states = wheels.expected_states(SEED, "applied")
    rows = sum(state == "applied" for state in states.values())  # two may share a file
    assert result.stdout.count("  applied ") == rows and "git tag v0.5.9" in result.stdout
    result = runner.invoke(app, ["revert", "--target", str(root)])
    assert result.exit_code == 0, result.stderr
    assert snapshot(root / "python") == pristine and git(root, "diff", "--name-only") == ""
    assert git_state() == state
    assert not list(root.rglob("*.sglpatch"))
