"""apply --interactive: per patch its reason and diff, then y / n / q, like `git add -p`."""

from __future__ import annotations

import json
import select
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api, catalogue
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

KIMI = "sglang/srt/models/kimi_k25.py"
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
TWO_SHOT = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"


# 0.5.9's patches in the order apply -i offers them; those fixed upstream or not for this
# release are never offered, and keep that state whatever the answers.
ROWS = api.list_patches(SEED)
OFFERED = [row.id for row in ROWS if row.outlook == "applies"]
# What is asked: a half of a change whose other half was asked earlier takes that answer.
HALVES = {p.id: p.applied_with for p in catalogue.load()}
ASKED = [i for n, i in enumerate(OFFERED) if not set(HALVES[i]) & set(OFFERED[:n])]
OTHERS = {row.id: str(row.effect) for row in ROWS if row.id not in OFFERED}


def states(site: Path) -> dict[str, str]:
    return {row.id: row.state for row in api.status(site).patches}


def answers(default: str, **chosen: str) -> str:
    """One answer per offered patch: `chosen` by id (underscores for dashes), else `default`."""
    return "".join(f"{chosen.get(i.replace('-', '_'), default)}\n" for i in ASKED)


def test_yes_no_yes(runner: CliRunner, site_059: Path) -> None:
    before = (site_059 / SIZES).read_bytes()
    result = runner.invoke(
        app,
        ["apply", "-i", "--target", str(site_059)],
        input=answers("y", sm120_symm_mem_sizes="n"),
    )
    assert result.exit_code == 0, result.stderr
    out = result.stdout
    # the reason, then the diff, for each patch in turn
    assert out.index("kimi-k25-eagle3-interface: Kimi K2.5 exposes") < out.index(f"+++ b/{KIMI}")
    assert out.index(f"+++ b/{KIMI}") < out.index(f"+++ b/{SIZES}") < out.index(f"+++ b/{TWO_SHOT}")
    assert states(site_059) == {i: "applied" for i in OFFERED} | OTHERS | {
        "sm120-symm-mem-sizes": "not applied"
    }
    assert (site_059 / SIZES).read_bytes() == before
    # the skipped one can be added later, and the ledger keeps all three
    assert (
        runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="y\n").exit_code == 0
    )
    assert states(site_059) == {i: "applied" for i in OFFERED} | OTHERS


def test_quit_applies_what_was_chosen(runner: CliRunner, site_059: Path) -> None:
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="y\nq\n")
    assert result.exit_code == 0
    assert states(site_059)["kimi-k25-eagle3-interface"] == "applied"
    assert states(site_059)["sm120-symm-mem-sizes"] == "not applied"


def test_nothing_chosen_writes_nothing(runner: CliRunner, site_059: Path) -> None:
    result = runner.invoke(
        app, ["apply", "-i", "--target", str(site_059)], input="x\n" + answers("n")
    )
    assert result.exit_code == 0 and "No patch chosen" in result.stdout
    assert "y: apply this patch" in result.stderr  # help for an unknown answer
    assert states(site_059) == {i: "not applied" for i in OFFERED} | OTHERS
    assert api.log(site_059).entries == []


def test_end_of_input_aborts_with_nothing_written(runner: CliRunner, site_059: Path) -> None:
    """EOF after a "y": exit 1 and a message; the "y" is not applied."""
    result = runner.invoke(app, ["apply", "-i", "--target", str(site_059)], input="y\n")
    assert result.exit_code == ExitCode.REFUSED, result.stdout
    assert "input ended" in result.stderr and "nothing was written" in result.stderr
    assert states(site_059) == {i: "not applied" for i in OFFERED} | OTHERS
    assert api.log(site_059).entries == []


def test_ctrl_c_at_a_prompt_aborts_with_nothing_written(site_059: Path) -> None:
    """A real SIGINT while the second question waits, after a "y" to the first."""
    process = subprocess.Popen(
        [sys.executable, "-m", "sglpatch", "apply", "-i", "--target", str(site_059)],
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stdin is not None and process.stderr is not None
    asked = b""
    for answer in (b"y\n", None):
        while asked.count(b"[y,n,q,?]:") < (1 if answer else 2):
            ready, _, _ = select.select([process.stderr], [], [], 60)
            if not ready:
                process.kill()
                pytest.fail(f"no question on stderr: {asked!r}")
            asked += process.stderr.read1(4096)
        if answer:
            process.stdin.write(answer)
            process.stdin.flush()
    process.send_signal(signal.SIGINT)
    err = asked + process.stderr.read()
    assert process.wait() == ExitCode.INTERRUPTED, err
    assert b"sglpatch: error: interrupted" in err
    assert states(site_059) == {i: "not applied" for i in OFFERED} | OTHERS
    assert api.log(site_059).entries == []


def test_interactive_json_keeps_stdout_one_object(runner: CliRunner, site_059: Path) -> None:
    singles = [i for i in ASKED if not HALVES[i]]
    chosen = {singles[0], singles[2]}  # yes, no, yes, then no to the rest
    result = runner.invoke(
        app,
        ["apply", "-i", "--json", "--target", str(site_059)],
        input="".join("y\n" if i in chosen else "n\n" for i in ASKED),
    )
    assert result.exit_code == 0, result.stderr
    report = json.loads(result.stdout)  # prompts and diffs went to stderr
    assert report["written"]
    assert sorted(report["changed"]) == sorted(str(r.file) for r in ROWS if r.id in chosen)
    assert "Apply kimi-k25-eagle3-interface" in result.stderr and "+++ b/" in result.stderr
    result = runner.invoke(
        app,
        ["apply", "-i", "--json", "--target", str(site_059)],
        input="n\n" * (len(ASKED) - len(chosen)),
    )
    assert json.loads(result.stdout)["written"] is False


def test_one_answer_takes_both_halves_of_a_change(runner: CliRunner, site_059: Path) -> None:
    """The DSA indexer's torch logits and the backend's schedule are one change in two files:
    the first asked takes the answer for both, and the second says so instead of asking."""
    first = "sm120-dsa-backend-torch-schedule"
    (second,) = HALVES[first]
    assert first in ASKED and second not in ASKED
    result = runner.invoke(
        app,
        ["apply", "-i", "--target", str(site_059)],
        input=answers("n", **{first.replace("-", "_"): "y"}),
    )
    assert result.exit_code == 0, result.stderr
    assert f"{second}: " in result.stdout and f"(chosen with {first})" in result.stdout
    applied = {i for i, state in states(site_059).items() if state == "applied"}
    assert applied == {first, second}
