"""--json on every command: one object on stdout, the documented keys, the same exit codes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

# The catalogue; what each patch does on 0.5.9 comes from `wheels.expected_states`.
ROWS = api.list_patches(SEED)


def as_json(runner: CliRunner, *args: str, code: int = 0) -> dict[str, object]:
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == code, result.stderr
    data = json.loads(result.stdout)
    assert isinstance(data, dict)
    return data


def test_each_command(runner: CliRunner, site_059: Path) -> None:
    target = ["--target", str(site_059)]
    status = as_json(runner, "status", *target)
    assert {"target", "release", "ledger", "patches"} <= set(status)
    assert status["target"] == str(site_059) and status["release"] == SEED
    states = {p["id"]: p["state"] for p in status["patches"]}
    assert states == wheels.expected_states(SEED, "not applied")

    dry = as_json(runner, "apply", "--dry-run", *target)
    assert (
        dry["dry_run"] is True and dry["written"] is False and dry["diff"].startswith("diff --git")
    )
    states = {p["id"]: p["state"] for p in dry["patches"]}
    assert states == wheels.expected_states(SEED, "applied")

    applied = as_json(runner, "apply", *target)
    assert applied["written"] is True
    assert sorted(applied["changed"]) == wheels.applied_targets(SEED)
    assert applied["commit"]

    again = as_json(runner, "apply", *target)
    states = {p["id"]: p["state"] for p in again["patches"]}
    assert states == wheels.expected_states(SEED, "already applied")

    log = as_json(runner, "log", *target)
    assert [e["summary"].split(":")[0] for e in log["entries"]] == ["apply"]

    reverted = as_json(runner, "revert", *target)
    assert sorted(reverted["restored"]) == sorted(applied["changed"])

    listing = as_json(runner, "list", "--release", "0.5.12")
    assert [(p["id"], p["tested"]) for p in listing["patches"]] == [
        (row.id, "<=0.5.23,>=0.5.3") for row in ROWS
    ]
    assert listing["patches"][0]["outlook"].startswith("already upstream")


def test_exit_codes_stay_the_same(runner: CliRunner, site_059: Path) -> None:
    kimi = site_059 / "sglang/srt/models/kimi_k25.py"
    kimi.write_bytes(
        kimi.read_bytes().replace(b"class KimiK25ForConditionalGeneration", b"class Renamed")
    )
    data = as_json(runner, "apply", "--target", str(site_059), code=ExitCode.TARGET)
    failed = [p for p in data["patches"] if p["state"] == "failed"]
    assert (
        failed[0]["id"] == "kimi-k25-eagle3-interface"
        and "KimiK25ForConditionalGeneration" in failed[0]["reason"]
    )
    result = runner.invoke(app, ["status", "--target", "/nonexistent", "--json"])
    assert result.exit_code == ExitCode.TARGET and result.stdout == ""
