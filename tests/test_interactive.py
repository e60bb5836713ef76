"""apply --interactive: per patch its reason and diff, then y / n / q, like `git add -p`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from tests import wheels

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
TWO_SHOT = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
APPLYING = wheels.applying("0.5.9")


def states(site: Path) -> dict[str, str]:
    return {row.id: row.state for row in api.status(site).patches}


def test_yes_no_yes(runner: CliRunner, site_059: Path) -> None:
    before = (site_059 / SIZES).read_bytes()
    # Yes to each patch in turn, except no to the sizes table.
    answers = "".join("n\n" if i == "sm120-symm-mem-sizes" else "y\n" for i in APPLYING)
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input=answers)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    # the reason, then the diff, for each patch in turn
    assert out.index("kimi-k25-eagle3-interface: Kimi K2.5 exposes") < out.index(f"+++ b/{KIMI}")
    assert out.index(f"+++ b/{KIMI}") < out.index(f"+++ b/{SIZES}") < out.index(f"+++ b/{TWO_SHOT}")
    assert {i: states(site_059)[i] for i in APPLYING} == {
        i: "not applied" if i == "sm120-symm-mem-sizes" else "applied" for i in APPLYING
    }
    assert (site_059 / SIZES).read_bytes() == before
    # the skipped one can be added later, and the ledger keeps all three
    assert (
        runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="y\n").exit_code == 0
    )
    assert {states(site_059)[i] for i in APPLYING} == {"applied"}


def test_quit_applies_what_was_chosen(runner: CliRunner, site_059: Path) -> None:
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="y\nq\n")
    assert result.exit_code == 0
    assert states(site_059)["kimi-k25-eagle3-interface"] == "applied"
    assert states(site_059)["sm120-symm-mem-sizes"] == "not applied"


def test_nothing_chosen_writes_nothing(runner: CliRunner, site_059: Path) -> None:
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="x\nn\nn\nn\n")
    assert result.exit_code == 0 and "No patch chosen" in result.stdout
    assert "y: apply this patch" in result.stderr  # help for an unknown answer
    assert set(states(site_059).values()) == {"not applied"}
    assert api.log(site_059)[1] == []
