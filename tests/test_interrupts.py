"""Ctrl-C at any moment of `doctor --catalog` and `list`: exit 130, one line, no traceback.

However early it lands (the CLI, the catalogue, a plugin or libcst still importing) and wherever
(Python's at-fork callbacks as doctor starts its workers, a class being created), a Ctrl-C is
the one line `sglpatch: error: interrupted` and exit 130, or, once the command has answered,
that answer whole.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch.cli import app
from sglpatch.doctor.read.pool import usable_cores
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

REPO = Path(__file__).resolve().parent.parent
CHATTER = "chatter from the plugin"

# A plugin that imports libcst itself, as most do: its import runs libcst's.
PLUGIN = '''"""A test plugin that imports libcst at import and talks on stdout."""

from __future__ import annotations

import libcst as cst
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import Patch

print("{chatter}")


class Talks(Patch):
    """Appends a line; says so on stdout."""

    id = "talks"
    description = "talks"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release: Version) -> str | None:
        {landing}
        return "srt/models/kimi_k25.py"

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        return module.with_changes(body=[*module.body, cst.parse_statement("TALKS = 1\\n")])

    def postcondition(self, module: cst.Module, release: Version) -> None:
        pass
'''

# `python -c DRIVER HOW:WHAT sglpatch-args...`: sglpatch's own entry point, with a Ctrl-C sent
# to the whole process group (as a terminal's reaches doctor's workers too):
#   after:SECONDS  that long after sglpatch's first line of code runs (-1: never)
#   import:MODULE  as MODULE starts importing
#   fork:signal    from Python's at-fork callbacks, as doctor forks its workers
#   fork:raise     a KeyboardInterrupt raised there, as if the signal had landed in one
DRIVER = """
import importlib.abc, os, signal, sys, threading
from sglpatch.__main__ import main
how, what = sys.argv[1].split(":")
def ctrl_c():
    os.killpg(os.getpgid(0), signal.SIGINT)
if how == "after" and float(what) >= 0:
    timer = threading.Timer(float(what), ctrl_c)
    timer.daemon = True
    timer.start()
elif how == "import":
    class Trip(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path, target=None):
            if name == what:
                sys.meta_path.remove(self)
                ctrl_c()
            return None
    sys.meta_path.insert(0, Trip())
elif how == "fork":
    parent = os.getpid()
    def landed():
        if os.getpid() == parent and not os.environ.get("LANDED"):
            os.environ["LANDED"] = "1"
            if what == "raise":
                raise KeyboardInterrupt
            ctrl_c()
            sum(range(1000))  # the handler runs here, if nothing holds the signal back
    os.register_at_fork(after_in_parent=landed)
sys.argv = ["sglpatch", *sys.argv[2:]]
main()
"""


@pytest.fixture(scope="module")
def tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree(SEED, tmp_path_factory.mktemp("interrupts") / SEED)


def write_plugin(folder: Path, landing: str = "pass") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "talks.py").write_text(PLUGIN.format(chatter=CHATTER, landing=landing))
    return folder


def sglpatch(when: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", DRIVER, when, *args],
        capture_output=True, text=True, cwd=REPO, check=False, timeout=300,
        start_new_session=True,  # its own process group: the Ctrl-C reaches no one else
    )  # fmt: skip


def answered(run: subprocess.CompletedProcess[str], finished: int) -> bool:
    """The one line and 130; or, for a Ctrl-C that came once the answer was given, that answer
    whole (one JSON object, nothing on stderr). True if it was interrupted."""
    said = [line for line in run.stderr.splitlines() if line != CHATTER]
    if run.returncode == ExitCode.INTERRUPTED:
        assert said == ["sglpatch: error: interrupted"], run.stderr
        return True
    assert (run.returncode, said) == (finished, []), run.stderr
    json.loads(run.stdout)
    return False


@pytest.mark.wheel
def test_ctrl_c_at_random_moments_of_doctor(tree: Path, tmp_path: Path) -> None:
    """Ten seeded random moments: half in the first fifth of a run (the CLI, the catalogue, the
    plugin and libcst importing), half anywhere in it."""
    plugin = write_plugin(tmp_path / "plugin")
    args = ["doctor", "--json", "--target", str(tree), "--catalog", str(plugin)]
    began = time.monotonic()
    assert not answered(sglpatch("after:-1", *args), ExitCode.GAPS)
    took = time.monotonic() - began
    rng = random.Random(20261202)
    stopped = 0
    for round_ in range(10):
        delay = rng.uniform(0, took / 5 if round_ % 2 == 0 else took)
        stopped += answered(sglpatch(f"after:{delay:.4f}", *args), ExitCode.GAPS)
    assert stopped >= 5  # the early half at least was interrupted


def test_ctrl_c_while_typer_parses_the_command_line(tmp_path: Path) -> None:
    """typer ends a Ctrl-C that lands before the command runs with a silent exit 130."""
    plugin = write_plugin(tmp_path / "plugin")
    run = sglpatch("import:typer._click.decorators", "list", "--json", "--catalog", str(plugin))
    assert answered(run, ExitCode.OK)


@pytest.mark.wheel
@pytest.mark.parametrize("module", ["libcst._batched_visitor", "libcst._nodes.base"])
def test_ctrl_c_while_a_plugin_imports_libcst(module: str, tree: Path, tmp_path: Path) -> None:
    """The plugin's `import libcst` ran libcst's code inside CPython's import statement, which
    dropped the Ctrl-C and left half a libcst behind: exit 70 on its missing names."""
    plugin = write_plugin(tmp_path / "plugin")
    run = sglpatch(
        f"import:{module}", "doctor", "--json", "--target", str(tree), "--catalog", str(plugin)
    )
    assert answered(run, ExitCode.GAPS)


@pytest.mark.wheel
@pytest.mark.skipif(usable_cores() < 2, reason="doctor forks no workers on one core")
@pytest.mark.parametrize("how", ["signal", "raise"])
def test_ctrl_c_as_doctor_forks_its_workers(how: str, tree: Path) -> None:
    """Python prints a KeyboardInterrupt raised in an at-fork callback ("Exception ignored")
    and runs on: doctor finished with 5 and a traceback."""
    run = sglpatch(f"fork:{how}", "doctor", "--json", "--target", str(tree))
    assert answered(run, ExitCode.GAPS)


# A Ctrl-C that lands while a class is created (a field's __set_name__, as in libcst's nodes)
# comes out of Python 3.11 as a RuntimeError "Error calling __set_name__".
LANDS = """
        class Landed:
            def __set_name__(self, owner: type, name: str) -> None:
                raise KeyboardInterrupt

        class Node:
            field = Landed()
"""


@pytest.mark.parametrize("where", ["import", "target_file"])
def test_ctrl_c_turned_into_another_error_in_a_plugin(
    runner: CliRunner, tmp_path: Path, where: str
) -> None:
    """It was the plugin's failure (exit 2 at import, 3 in a method), not an interrupt."""
    plugin = write_plugin(tmp_path / "plugin", LANDS.strip() if where == "target_file" else "pass")
    if where == "import":
        with (plugin / "talks.py").open("a") as module:
            module.write(textwrap.dedent(LANDS))
    result = runner.invoke(app, ["list", "--release", SEED, "--catalog", str(plugin)])
    assert result.exit_code == ExitCode.INTERRUPTED, result.stderr
    assert result.stderr.splitlines() == [CHATTER, "sglpatch: error: interrupted"]
