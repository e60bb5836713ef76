"""A plugin's writes to stdout go to stderr, file descriptor 1 too: `--json` stays one object.

`print()` was redirected, but `os.write(1, ...)` and a subprocess that inherits stdout (`echo`)
wrote into the JSON, at the plugin's import and in any of its patch's methods.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sglpatch import plugin_stdout
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

REPO = Path(__file__).resolve().parent.parent

PLUGIN = '''"""A test plugin that writes to file descriptor 1 itself, and runs `echo`."""

from __future__ import annotations

import os
import subprocess

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import AlreadyPresent, Patch, cst

SAID = set()


def speak(where: str) -> None:
    if where not in SAID:  # once per place: `echo` is a process
        SAID.add(where)
        os.write(1, f"fd chatter in {where}\\n".encode())
        subprocess.run(["echo", f"echo chatter in {where}"], check=True)


speak("import")


class Speaks(Patch):
    """Appends a line, and talks on stdout at every step."""

    id = "speaks"
    description = "talks on descriptor 1"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def __init__(self) -> None:
        speak("init")

    def target_file(self, release: Version) -> str | None:
        speak("target_file")
        return "srt/models/kimi_k25.py"

    def is_tested(self, release: Version) -> bool:
        speak("is_tested")
        return super().is_tested(release)

    def fixed_upstream(self, release: Version) -> bool:
        speak("fixed_upstream")
        return super().fixed_upstream(release)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        speak("transform")
        if "SPEAKS = 1" in module.code:
            raise AlreadyPresent("there")
        return module.with_changes(body=[*module.body, cst.parse_statement("SPEAKS = 1\\n")])

    def postcondition(self, module: cst.Module, release: Version) -> None:
        speak("postcondition")
'''


def in_catalog(folder: Path) -> tuple[list[str], dict[str, str]]:
    folder.mkdir(parents=True)
    (folder / "speaks.py").write_text(PLUGIN)
    return ["--catalog", str(folder)], {}


def installed(site: Path) -> tuple[list[str], dict[str, str]]:
    """The plugin as an installed package declaring it in the `sglpatch.patches` group."""
    (site / "speaking_patches").mkdir(parents=True)
    (site / "speaking_patches" / "__init__.py").write_text("")
    (site / "speaking_patches" / "speaks.py").write_text(PLUGIN)
    info = site / "speaking_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: speaking-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[sglpatch.patches]\nspeaks = speaking_patches.speaks\n")
    path = os.pathsep.join(x for x in (str(site), os.environ.get("PYTHONPATH")) if x)
    return [], {"PYTHONPATH": path}


COMMANDS = {
    "list": (["list", "--release", SEED, "--json"], {"import", "init", "fixed_upstream"}),
    "apply --dry-run": (["apply", "--dry-run", "--json"], {"import", "transform", "postcondition"}),
    "status": (["status", "--json"], {"import", "init", "target_file", "is_tested"}),
    "doctor": (["doctor", "--json"], {"import", "init", "target_file"}),  # codemods: in workers
}
CASES = [(c, "--catalog") for c in COMMANDS] + [("list", "installed"), ("doctor", "installed")]


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree(SEED, tmp_path_factory.mktemp("speaking") / SEED)


@pytest.mark.parametrize(("command", "how"), CASES, ids=[f"{c} {h}" for c, h in CASES])
def test_json_stays_one_object(command: str, how: str, tree: Path, tmp_path: Path) -> None:
    words, places = COMMANDS[command]
    plugin, env = in_catalog(tmp_path / "c") if how == "--catalog" else installed(tmp_path / "s")
    target = [] if command == "list" else ["--target", str(tree)]
    target += ["--ledger", str(tmp_path / "l")] if command in ("apply --dry-run", "status") else []
    run = subprocess.run(
        [sys.executable, "-m", "sglpatch", *words, *target, *plugin],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=300,
        env={**os.environ, **env},
    )  # fmt: skip
    assert run.returncode in (0, 5), run.stderr  # 5: doctor's blockers
    data = json.loads(run.stdout)
    if command != "doctor":  # which names only the patches that block
        assert '"speaks"' in json.dumps(data)  # the plugin's patch is in the object
    for where in places:
        assert f"fd chatter in {where}\n" in run.stderr, where
        assert f"echo chatter in {where}\n" in run.stderr, where


def test_descriptor_1_is_stdout_again_after_the_plugin(capfd: pytest.CaptureFixture[str]) -> None:
    os.write(1, b"before\n")
    with plugin_stdout.to_stderr():
        os.write(1, b"plugin\n")
        with plugin_stdout.to_stderr():  # a guarded call inside another
            os.write(1, b"inner\n")
        os.write(1, b"still plugin\n")
    os.write(1, b"after\n")
    out, err = capfd.readouterr()
    assert (out, err) == ("before\nafter\n", "plugin\ninner\nstill plugin\n")
