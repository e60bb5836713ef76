"""doctor says what to run next (issue 34, point 6): `sglpatch apply` with the options typed,
then the user's launch without the flags that must change on capability 12
(`facts.launch_advice`). Real 0.5.9 trees from the cached wheels, as test_doctor_launch.py has.
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.doctor.test_doctor_launch import LAUNCH, hub, nvidia_smi
from tests.support import wheels
from tests.support.releases import RELEASES, SEED

pytestmark = pytest.mark.wheel
__all__ = ["hub"]  # the stand-in Hugging Face cache, a fixture used here

SYMM = "--enable-torch-symm-mem"
USER = [*LAUNCH, "--model-path", "moonshotai/Kimi-K2.5", "--tp", "2"]
USER += ["--speculative-algorithm", "EAGLE3"]


@pytest.fixture
def tree(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh 0.5.9 tree (each test may apply to it); nvidia-smi says 12.0."""
    nvidia_smi(tmp_path, monkeypatch, "12.0")
    return wheels.full_tree(SEED, tmp_path / SEED)


def run(site: Path, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["doctor", "--target", str(site), *args])
    assert result.exit_code in (0, ExitCode.GAPS), result.output
    return result.exit_code, result.stdout


def steps(site: Path, *args: str) -> list[dict[str, Any]]:
    found: list[dict[str, Any]] = json.loads(run(site, "--json", *args)[1])["next"]
    return found


def next_section(shown: str) -> list[str]:
    """The lines of the text's "Next:" section (the last one), without its heading."""
    lines = shown.splitlines()
    if "Next:" not in lines:
        return []
    return lines[lines.index("Next:") + 1 :]


def as_text(found: list[dict[str, Any]]) -> list[str]:
    return [line for s in found for line in (f"  {s['command']}", f"      ({s['why']})")]


def test_seed_user_applies_then_drops_symm_mem(tree: Path, hub: Path) -> None:
    """Kimi K2.5 + EAGLE-3 + symmetric memory on 0.5.9: apply (with the --target typed), then
    the launch without --enable-torch-symm-mem, and why."""
    launch = [*USER, SYMM]
    found = steps(tree, "--", *launch)
    assert [s["command"] for s in found] == [
        f"sglpatch apply --target {shlex.quote(str(tree))}",
        shlex.join(USER),
    ]
    assert "fixes" in found[0]["why"]
    assert found[1]["why"].startswith(f"drop {SYMM}: no capability-12 part has NVLink multicast")
    code, shown = run(tree, "--", *launch)
    assert code == ExitCode.GAPS
    assert next_section(shown) == as_text(found)  # JSON equals text, and the section is last
    # The arguments alone (no command words) come back as a whole command.
    bare = steps(tree, "--", *launch[len(LAUNCH) :])
    assert bare[1]["command"] == shlex.join(USER)


def test_after_apply_only_the_launch_line(tree: Path, hub: Path) -> None:
    result = CliRunner().invoke(app, ["apply", "--target", str(tree)])
    assert result.exit_code == 0, result.output
    found = steps(tree, "--", *USER, SYMM)
    assert [s["command"] for s in found] == [shlex.join(USER)]
    assert next_section(run(tree, "--", *USER, SYMM)[1]) == as_text(found)


def test_nothing_to_do_no_next(tree: Path, hub: Path) -> None:
    """No table flag and nothing to apply: no Next section, `next` empty."""
    result = CliRunner().invoke(app, ["apply", "--target", str(tree)])
    assert result.exit_code == 0, result.output
    assert steps(tree, "--", *USER) == []
    code, shown = run(tree, "--", *USER)
    assert code == 0 and "Next:" not in shown.splitlines()
    # Apply with work left and no launch: the apply line alone, with --release as typed.
    fresh = wheels.full_tree(SEED, tree.parent / "fresh")
    found = steps(fresh, "--release", SEED)
    assert [s["command"] for s in found] == [
        f"sglpatch apply --target {shlex.quote(str(fresh))} --release {SEED}"
    ]


# The newest release sm120-allreduce-fusion-refusal patches (its TARGET: "<0.5.8").
FUSION_REFUSED = RELEASES[RELEASES.index("0.5.8") - 1]
FUSION = "--enable-flashinfer-allreduce-fusion"


def test_fusion_flag_dropped_at_tp_above_one_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hub: Path
) -> None:
    """0.5.7 refuses the fusion flag on 12 at TP > 1 once patched: the launch drops it there; at
    TP 1 (nothing to fuse) it stays, and the launch is shown as given."""
    nvidia_smi(tmp_path, monkeypatch, "12.0")
    site = wheels.full_tree(FUSION_REFUSED, tmp_path / FUSION_REFUSED)
    base = [*LAUNCH, "--model-path", "openai/gpt-oss-120b"]
    found = steps(site, "--", *base, "--tp", "2", FUSION)
    assert found[-1]["command"] == shlex.join([*base, "--tp", "2"])
    assert found[-1]["why"].startswith(f"drop {FUSION}: at TP > 1")
    found = steps(site, "--", *base, FUSION)  # TP 1
    assert found[-1]["command"] == shlex.join([*base, FUSION])
    assert found[-1]["why"] == "the launch as given"
