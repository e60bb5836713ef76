"""apply --only / --skip, recorded in the ledger; status --check; list --release by effect."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.store import State
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

KIMI = "kimi-k25-eagle3-interface"
SIZES = "sm120-symm-mem-sizes"
TWO_SHOT = "sm120-symm-mem-two-shot"
ALL = {KIMI, SIZES, TWO_SHOT}
# 0.5.9 from list --release: the patches apply applies, and those status --check finds in place
# after it (upstream's fixes count; patches not for this release do not).
ROWS = api.list_patches(SEED)
OFFERED = [row.id for row in ROWS if row.outlook == "applies"]
IN_PLACE = [row.id for row in ROWS if row.effect in ("applies", "already upstream")]


def invoke(runner: CliRunner, *args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


def states(site: Path) -> dict[str, str]:
    return {row.id: row.state for row in api.status(site).patches}


def check(runner: CliRunner, site: Path) -> tuple[int, str, str]:
    return invoke(runner, "status", "--check", "--target", str(site))


def test_skip_is_recorded_and_exact_through_status_check_apply_and_revert(
    runner: CliRunner, site_059: Path
) -> None:
    pristine = snapshot(site_059)
    code, out, err = invoke(runner, "apply", "--skip", TWO_SHOT, "--target", str(site_059))
    assert code == 0, err
    changed = {k for k, v in snapshot(site_059).items() if v != pristine[k]}
    assert changed == {m for m in wheels.applied_targets(SEED) if "torch_symm_mem" not in m}
    assert states(site_059) == wheels.expected_states(SEED, "applied") | {TWO_SHOT: "skipped"}
    entries = api.log(site_059).entries
    skipped = [row.id for row in api.status(site_059).patches if row.state == "skipped"]
    assert skipped == [TWO_SHOT] and f"skipped: {TWO_SHOT}" in entries[0].message

    code, out, err = check(runner, site_059)  # a patch the user chose to skip is no failure
    assert code == 0 and out.count("\n") == 1 and f"skipped by choice: {TWO_SHOT}" in out, err

    code, out, err = invoke(runner, "apply", "--target", str(site_059))  # a plain apply: all
    assert code == 0 and "Patched 1 file(s)" in out, err
    assert states(site_059) == wheels.expected_states(SEED, "applied")
    assert [row.id for row in api.status(site_059).patches if row.state == "skipped"] == []

    assert invoke(runner, "revert", "--target", str(site_059))[0] == 0
    assert snapshot(site_059) == pristine
    # revert forgets the choice too
    assert states(site_059) == wheels.expected_states(SEED, "not applied")


def test_only_records_the_others_as_skipped(runner: CliRunner, site_059: Path) -> None:
    code, _, err = invoke(runner, "apply", "--only", f"{KIMI},{SIZES}", "-t", str(site_059))
    assert code == 0, err
    skipped = wheels.expected_states(SEED, "skipped")
    assert states(site_059) == skipped | {KIMI: "applied", SIZES: "applied"}
    # --only on top: what it applies leaves the skipped list, the rest stays skipped
    code, _, err = invoke(runner, "apply", "--only", TWO_SHOT, "-t", str(site_059))
    assert code == 0, err
    assert states(site_059) == skipped | {KIMI: "applied", SIZES: "applied", TWO_SHOT: "applied"}


def test_skipping_everything_still_records_the_choice(runner: CliRunner, site_059: Path) -> None:
    before = snapshot(site_059)
    args = ["--skip", OFFERED[0], "--skip", ",".join(OFFERED[1:])]  # repeated, comma-separated
    code, out, err = invoke(runner, "apply", *args, "--target", str(site_059))
    assert code == 0 and "recorded the patches left out as skipped" in out, err
    assert snapshot(site_059) == before
    assert states(site_059) == wheels.expected_states(SEED, "skipped")
    assert check(runner, site_059)[0] == 0


def test_a_dry_run_records_no_skip(runner: CliRunner, site_059: Path) -> None:
    code, _, _ = invoke(runner, "apply", "--dry-run", "--skip", KIMI, "-t", str(site_059))
    assert code == 0 and states(site_059)[KIMI] == "not applied"
    assert api.log(site_059).entries == []


@pytest.mark.parametrize("option", ["--only", "--skip"])
def test_unknown_ids_are_refused_with_the_known_ones(
    runner: CliRunner, site_059: Path, option: str
) -> None:
    before = snapshot(site_059)
    code, _, err = invoke(runner, "apply", option, f"{KIMI},kimi-k2.5", "-t", str(site_059))
    assert code == ExitCode.USAGE and err.count("\n") == 1
    assert "no patch called kimi-k2.5" in err and all(i in err for i in ALL)
    assert snapshot(site_059) == before and api.log(site_059).entries == []


def test_interactive_does_not_mix_with_only(runner: CliRunner, site_059: Path) -> None:
    code, _, err = invoke(runner, "apply", "-i", "--only", KIMI, "-t", str(site_059))
    assert code == ExitCode.USAGE and "--interactive" in err


def test_a_state_from_before_skip_still_reads() -> None:
    old = {"release": SEED, "patches": [KIMI], "files": {}}
    assert State.from_json(old) == State(SEED, [KIMI], {}, [])
    assert json.loads(State(SEED, [], {}, [SIZES]).to_json())["skipped"] == [SIZES]


def test_check_fails_until_applied_and_after_a_reinstall(runner: CliRunner, site_059: Path) -> None:
    code, out, err = check(runner, site_059)
    assert code == ExitCode.NOT_IN_PLACE == 1 and out == "" and err.count("\n") == 1
    assert all(i in err for i in OFFERED) and "SGLang 0.5.9" in err
    hint = err.strip().split("; run ")[1]
    assert hint == f"sglpatch apply --target {site_059}"
    assert invoke(runner, *hint.split()[1:])[0] == 0  # the hint, as typed

    code, out, err = check(runner, site_059)
    upstream = sum(row.effect == "already upstream" for row in ROWS)
    ok = (
        f"ok: {len(IN_PLACE)} patch(es) in place ({len(IN_PLACE) - upstream} applied, "
        f"{upstream} already upstream) on SGLang 0.5.9 at {site_059}\n"
    )
    assert code == 0 and out == ok, err

    # a reinstall puts the wheel's bytes back behind sglpatch's back
    member = next(m for m in wheels.patch_targets(SEED) if m.endswith("all_reduce_utils.py"))
    (site_059 / member).write_bytes(wheels.member(SEED, member))
    code, _, err = check(runner, site_059)
    assert code == 1 and SIZES in err and all(i not in err for i in IN_PLACE if i != SIZES)

    code, out, _ = invoke(runner, "status", "--check", "--json", "-t", str(site_059))
    data = json.loads(out)
    assert code == 1 and data["ok"] is False and [m["id"] for m in data["missing"]] == [SIZES]
    assert sorted(data["in_place"]) == sorted(i for i in IN_PLACE if i != SIZES)


def test_check_needs_the_release(runner: CliRunner, site_059: Path) -> None:
    for info in site_059.glob("sglang-*.dist-info"):
        (info / "METADATA").unlink()
    (site_059 / "sglang" / "_version.py").unlink()
    code, out, err = check(runner, site_059)
    assert code == ExitCode.USAGE and out == "" and "cannot tell which SGLang release" in err


def test_check_reads_the_files_not_only_the_ledger(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    # patched by `patch -p1` from an export, as a Dockerfile without sglpatch does: no ledger
    diff = tmp_path / "sm120.patch"
    code, _, err = invoke(
        runner, "export", "-V", SEED, "-o", str(diff), "-t", str(site_059), "--ledger",
        str(tmp_path / "elsewhere"),
    )  # fmt: skip
    assert code == 0, err
    subprocess.run(["patch", "-p1", "-s", "-i", str(diff)], cwd=site_059, check=True)
    code, out, err = check(runner, site_059)
    assert code == 0 and f"{len(IN_PLACE)} patch(es) in place" in out, err


def test_check_after_an_upgrade_names_what_the_new_release_lacks(
    runner: CliRunner, tmp_path: Path
) -> None:
    old = wheels.site_packages(SEED, tmp_path / "site", wheels.patch_targets(SEED))
    assert invoke(runner, "apply", "--target", str(old))[0] == 0
    new = wheels.site_packages("0.5.12", tmp_path / "new", wheels.patch_targets("0.5.12"))
    for info in old.glob("sglang-*.dist-info"):  # `pip install -U sglang` in place
        subprocess.run(["rm", "-r", str(info)], check=True)
    subprocess.run(["cp", "-a", f"{new}/.", str(old)], check=True)
    code, _, err = check(runner, old)
    # Kimi is upstream in 0.5.12; the two capability-12 rows are gone with the old files
    assert code == 1 and "SGLang 0.5.12" in err and SIZES in err and TWO_SHOT in err
    assert KIMI not in err


@pytest.mark.parametrize("release", ["0.5.8", "0.5.12", "0.5.23"])
def test_list_groups_patches_by_what_apply_does(
    runner: CliRunner, release: str, tmp_path: Path
) -> None:
    code, out, _ = invoke(runner, "list", "--release", release)
    assert code == 0 and out.startswith(f"On SGLang {release}:")
    groups: dict[str, set[str]] = {}
    heading = ""
    for line in out.splitlines()[1:]:
        if line and not line.startswith(" "):
            heading = line.split(" (")[0].split(":")[0]
        elif line.startswith("  ") and not line.startswith("   "):
            groups.setdefault(heading, set()).add(line.split()[0])
    # the ground truth: what a dry run on the real wheel of that release does
    site = wheels.site_packages(release, tmp_path / "site", wheels.patch_targets(release))
    report = api.apply(site, None, tmp_path / "ledger", dry_run=True)
    truth: dict[str, set[str]] = {}
    for outcome in report.outcomes:
        effect = {"applied": "applies"}.get(outcome.state, outcome.state)
        truth.setdefault(effect, set()).add(outcome.patch_id)
    assert groups == truth


def test_list_outside_the_tested_releases_refuses_all(runner: CliRunner) -> None:
    code, out, _ = invoke(runner, "list", "--release", "0.9.0")
    assert code == 0 and "refused: untested on this release" in out
    listing = json.loads(invoke(runner, "list", "--release", "0.9.0", "--json")[1])
    assert {p["effect"] for p in listing["patches"]} == {"refused"}


def test_halves_of_one_change_are_chosen_together(runner: CliRunner, site_059: Path) -> None:
    """The DSA indexer's torch logits and the backend's schedule are one change in two files:
    `--only` or `--skip` of one alone is refused in one line, and nothing is written."""
    pristine = {p: p.read_bytes() for p in site_059.rglob("*.py")}
    for args in (
        ["--only", "sm120-dsa-indexer-torch-logits"],
        ["--skip", "sm120-dsa-backend-torch-schedule"],
    ):
        result = runner.invoke(app, ["apply", "--target", str(site_059), *args])
        assert result.exit_code == ExitCode.USAGE, result.output
        assert "are one change in two files: choose both or neither" in result.output
    assert {p: p.read_bytes() for p in site_059.rglob("*.py")} == pristine
    both = "sm120-dsa-indexer-torch-logits,sm120-dsa-backend-torch-schedule"
    assert runner.invoke(app, ["apply", "--target", str(site_059), "--only", both]).exit_code == 0


def test_every_half_names_a_patch_that_names_it_back() -> None:
    from sglpatch import catalogue

    patches = {p.id: p for p in catalogue.load()}
    for patch in patches.values():
        for other in patch.applied_with:
            assert patch.id in patches[other].applied_with, (patch.id, other)
