"""apply --interactive: per patch its reason and diff, then y / n / q, like `git add -p`."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api, catalogue
from sglpatch.cli import app

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
TWO_SHOT = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"


def states(site: Path) -> dict[str, str]:
    return {row.id: row.state for row in api.status(site).patches}


def test_yes_no_yes(runner: CliRunner, site_059: Path) -> None:
    before = (site_059 / SIZES).read_bytes()
    # the prompts come in catalogue order; patches this test does not name are declined
    order = [p.id for p in catalogue.load()]
    chosen = {"kimi-k25-eagle3-interface": "y", "sm120-symm-mem-sizes": "n"}
    chosen["sm120-symm-mem-two-shot"] = "y"
    answers = "".join(f"{chosen.get(i, 'n')}\n" for i in order)
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input=answers)
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    # the reason, then the diff, for each patch in turn
    assert out.index("kimi-k25-eagle3-interface: Kimi K2.5 exposes") < out.index(f"+++ b/{KIMI}")
    assert out.index(f"+++ b/{KIMI}") < out.index(f"+++ b/{SIZES}") < out.index(f"+++ b/{TWO_SHOT}")
    assert states(site_059) == {
        i: "applied" if chosen.get(i) == "y" else "not applied" for i in order
    }
    assert (site_059 / SIZES).read_bytes() == before
    # the skipped ones can be added later, and the ledger keeps them all
    skipped = sum(chosen.get(i) != "y" for i in order)
    assert (
        runner.invoke(
            app, ["apply", "-i", "--target", str(site_059)], input="y\n" * skipped
        ).exit_code
        == 0
    )
    assert set(states(site_059).values()) == {"applied"}


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
