"""A plugin's code never chooses sglpatch's exit code, nor writes on its stdout.

A patch module that calls `sys.exit(0)` (at import, or in any of its patch's methods) used to end
sglpatch with 0, so `sglpatch status --check || exit 1` let an unpatched tree through. Now it is
the plugin's failure, named: exit 2 when the module cannot even be loaded (as any plugin that
fails at import), exit 3 when its patch's code ran and raised. What a plugin prints goes to stderr,
so `--json` stays one JSON object.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner, Result

from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

REPO = Path(__file__).resolve().parent.parent
KIMI = "sglang/srt/models/kimi_k25.py"
CHATTER = "chatter from the plugin"

# `leave(where)` runs in every place a plugin's code can run; it exits where EXIT_IN says.
PLUGIN = '''"""A test plugin that ends the process from one of its places."""

from __future__ import annotations

import sys

import libcst as cst
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import Patch

EXIT_IN = {where!r}


def leave(where: str) -> None:
    print("{chatter} in " + where)
    if where == EXIT_IN:
        sys.exit(0)


leave("import")


class Leaves(Patch):
    """Calls sys.exit(0) in the method EXIT_IN names."""

    id = "leaves"
    description = "ends the process"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def __init__(self) -> None:
        leave("init")

    def target_file(self, release: Version) -> str | None:
        leave("target_file")
        return "srt/models/kimi_k25.py"

    def package_file(self, release: Version) -> str | None:
        leave("package_file")
        return super().package_file(release)

    def is_tested(self, release: Version) -> bool:
        leave("is_tested")
        return super().is_tested(release)

    def fixed_upstream(self, release: Version) -> bool:
        leave("fixed_upstream")
        return super().fixed_upstream(release)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        leave("transform")
        if "LEAVES = 1" in module.code:
            from sglpatch.patch import AlreadyPresent

            raise AlreadyPresent("there")
        return module.with_changes(body=[*module.body, cst.parse_statement("LEAVES = 1\\n")])

    def postcondition(self, module: cst.Module, release: Version) -> None:
        leave("postcondition")
'''


def write_plugin(folder: Path, where: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "leaves.py").write_text(PLUGIN.format(where=where, chatter=CHATTER))
    return folder


# The commands a plugin runs in, and the places each reaches (module import and __init__ in all).
PATCHING = {"target_file", "package_file", "is_tested", "transform", "postcondition"}
LOOKING = {"target_file", "package_file", "is_tested", "fixed_upstream"}  # no codemod runs
COMMANDS: dict[str, tuple[list[str], set[str]]] = {
    "apply": (["apply"], PATCHING),
    "apply --dry-run": (["apply", "--dry-run"], PATCHING),
    "status": (["status"], LOOKING),
    "status --check": (["status", "--check"], PATCHING),
    "export": (["export", "--release", SEED, "--output", "-"], PATCHING),
    "list --release": (["list", "--release", SEED], LOOKING),
}
AT_LOAD = ("import", "init")
PLACES = (
    *AT_LOAD,
    "target_file",
    "package_file",
    "is_tested",
    "fixed_upstream",
    "transform",
    "postcondition",
)


def run(runner: CliRunner, site: Path, ledger: Path, catalog: Path, command: list[str]) -> Result:
    where = [] if command[0] == "list" else ["--target", str(site), "--ledger", str(ledger)]
    return runner.invoke(app, [*command, *where, "--catalog", str(catalog)])


CASES = [
    (command, where)
    for command, (_, reached) in COMMANDS.items()
    for where in PLACES
    if where in AT_LOAD or where in reached
]


@pytest.mark.wheel
@pytest.mark.parametrize(("command", "where"), CASES, ids=[f"{c}: {w}" for c, w in CASES])
def test_a_plugin_that_exits_is_its_failure_wherever_it_exits(
    runner: CliRunner, site_059: Path, tmp_path: Path, command: str, where: str
) -> None:
    before = (site_059 / KIMI).read_bytes()
    catalog = write_plugin(tmp_path / "exits", where)
    result = run(runner, site_059, tmp_path / "ledger", catalog, COMMANDS[command][0])
    err = result.stderr
    code = result.exit_code
    if where in AT_LOAD:  # the module cannot be loaded: as any plugin that fails there
        assert code == ExitCode.USAGE, err
        assert "leaves" in err and "SystemExit: 0" in err, err
    else:
        assert code == ExitCode.TARGET, err
        assert f"patch leaves from {catalog} raised SystemExit: 0" in err, err
        assert "nothing was written" in err and "internal error" not in err
    assert CHATTER not in result.stdout
    assert (site_059 / KIMI).read_bytes() == before


@pytest.mark.wheel
@pytest.mark.parametrize(
    ("command", "place"),
    [
        (["apply", "--dry-run", "--json"], "transform"),
        (["status", "--json"], "package_file"),
        (["status", "--check", "--json"], "postcondition"),
        (["list", "--release", SEED, "--json"], "fixed_upstream"),
    ],
    ids=lambda x: " ".join(x) if isinstance(x, list) else x,
)
def test_a_plugin_that_prints_leaves_json_one_object(
    runner: CliRunner, site_059: Path, tmp_path: Path, command: list[str], place: str
) -> None:
    catalog = write_plugin(tmp_path / "chatty", "nowhere")
    result = run(runner, site_059, tmp_path / "ledger", catalog, command)
    assert result.exit_code in (ExitCode.OK, ExitCode.NOT_IN_PLACE), result.stderr
    data = json.loads(result.stdout)
    assert '"leaves"' in json.dumps(data)  # the plugin's patch is reported, in the object
    assert f"{CHATTER} in import" in result.stderr and f"{CHATTER} in {place}" in result.stderr


def sh(command: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["sh", "-c", command], capture_output=True, text=True, cwd=REPO, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip


@pytest.mark.wheel
@pytest.mark.parametrize("where", ["import", "transform"])
def test_the_entrypoint_guard_stops_an_unpatched_tree(
    site_059: Path, tmp_path: Path, where: str
) -> None:
    """The README's `sglpatch status --check || exit 1`, in a real process."""
    catalog = write_plugin(tmp_path / "exits", where)
    check = (
        f"{shlex.quote(sys.executable)} -m sglpatch status --check --target {site_059} "
        f"--catalog {catalog}"
    )
    result = sh(f"{check} || exit 1; echo let through")
    assert result.returncode == 1 and "let through" not in result.stdout, result.stdout
    alone = sh(check)
    assert alone.returncode == (ExitCode.USAGE if where == "import" else ExitCode.TARGET)
    (line,) = [x for x in alone.stderr.splitlines() if x.startswith("sglpatch: error:")]
    assert "SystemExit" in line and "Traceback" not in alone.stderr


def test_an_installed_plugin_that_exits_at_import_is_named(tmp_path: Path) -> None:
    site = tmp_path / "plugins"
    package = site / "quitting_patches"
    write_plugin(package, "import")
    (package / "__init__.py").write_text("")
    info = site / "quitting_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: quitting-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sglpatch.patches]\nleaves = quitting_patches.leaves\n")
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)
    result = sh(f"{shlex.quote(sys.executable)} -m sglpatch list --json", {"PYTHONPATH": path})
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stdout == ""  # neither the plugin's chatter nor half a JSON object
    assert "cannot load plugin quitting-patches (quitting_patches.leaves): SystemExit: 0" in (
        result.stderr
    )


@pytest.mark.wheel
def test_doctor_runs_a_plugin_under_the_same_guard(tmp_path: Path) -> None:
    """doctor runs the catalogue in memory (perhaps in its warm-up process): the same rules."""
    tree = wheels.full_tree(SEED, tmp_path / "site-packages")
    doctor = f"{shlex.quote(sys.executable)} -m sglpatch doctor --target {tree} --catalog"
    exits = sh(f"{doctor} {write_plugin(tmp_path / 'exits', 'transform')}")
    assert exits.returncode == ExitCode.TARGET, exits.stderr
    assert "patch leaves from" in exits.stderr and "raised SystemExit: 0" in exits.stderr
    chatty = sh(f"{doctor} {write_plugin(tmp_path / 'chatty', 'nowhere')} --json")
    assert chatty.returncode in (ExitCode.OK, ExitCode.GAPS), chatty.stderr
    assert json.loads(chatty.stdout)["release"] == SEED
    assert CHATTER in chatty.stderr and CHATTER not in chatty.stdout
