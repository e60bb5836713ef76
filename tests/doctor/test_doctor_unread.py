"""doctor on a tree this user may not read whole (issue #31, point 6): a folder it cannot list
or look into is listed as not judged and the answer is not "ready" (exit 5); `--model` whose
module or folder cannot be read is not judged for that model (exit 5), never an internal error
(exit 70) and never "for other models".

Root reads everything whatever the mode bits say. Run as root, these tests give the tree to
`nobody` and run doctor as root without the capabilities that pass over mode bits (setpriv drops
CAP_DAC_OVERRIDE and CAP_DAC_READ_SEARCH), so the tree's "other" bits apply to it while this
interpreter and its packages stay readable wherever they are (a clone in a 0700 folder too); run
as another user, they chmod the tree and run doctor as that user. Either way the kernel refuses
the reads: nothing is monkeypatched.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglpatch import api
from sglpatch.errors import ExitCode
from tests.support import wheels

pytestmark = pytest.mark.wheel

NOBODY = 65534
AS_ROOT = os.geteuid() == 0
MODELS = "sglang/srt/models"
MOE = "sglang/srt/layers/moe"
KIMI = "sglang/srt/models/kimi_k25.py"
KIMI_PATCH = "kimi-k25-eagle3-interface"
# What the user running doctor may do in a folder: nothing, look up names it knows (x), or list
# names it cannot look into (r). As root, the tree is nobody's and doctor runs without the
# capabilities that pass over mode bits: the "other" bits; else the owner's.
MODES = {"none": (0o700, 0o000), "search only": (0o701, 0o100), "list only": (0o704, 0o400)}
UNREADABLE_FILE = 0o600 if AS_ROOT else 0o000


class Tree:
    """The real release's patch targets and its `srt/layers/moe`, applied (doctor says ready),
    in a folder of /tmp the user who runs doctor can reach."""

    def __init__(self, release: str) -> None:
        self.top = Path(tempfile.mkdtemp(prefix="sglpatch-unread-"))
        self.top.chmod(0o755)
        files = wheels.patch_targets(release) + wheels.members(release, f"{MOE}/")
        self.site = wheels.site_packages(release, self.top / "site", files)
        api.apply(self.site, None, self.top / "ledger")
        self.home = self.top / "home"  # doctor's own (a crash log would go there)
        self.home.mkdir()
        if AS_ROOT:  # the tree is another user's: its "other" bits are what root may do
            for path in (self.site, *self.site.rglob("*")):
                os.chown(path, NOBODY, NOBODY, follow_symlinks=False)
        self.changed: list[tuple[Path, int]] = []

    def deny(self, name: str, mode: int) -> None:
        path = self.site / name
        self.changed.append((path, path.stat().st_mode))
        path.chmod(mode)

    def doctor(self, *args: str) -> subprocess.CompletedProcess[str]:
        argv = [sys.executable, "-m", "sglpatch", "doctor", "--target", str(self.site), *args]
        env = {**os.environ, "HOME": str(self.home), "NO_COLOR": "1"}
        if AS_ROOT:  # root, but bound by mode bits as any other user is
            caps = "-dac_override,-dac_read_search"
            argv = ["setpriv", f"--inh-caps={caps}", f"--bounding-set={caps}", *argv]
        return subprocess.run(
            argv, capture_output=True, text=True, check=False, env=env, timeout=300
        )

    def close(self) -> None:
        for path, mode in reversed(self.changed):
            path.chmod(mode)
        shutil.rmtree(self.top, ignore_errors=True)


@pytest.fixture
def tree(request: pytest.FixtureRequest) -> Iterator[Tree]:
    if AS_ROOT and not shutil.which("setpriv"):
        pytest.skip("run as root: needs setpriv to run doctor bound by mode bits")
    made = Tree(request.param)  # a release each test names (indirect)
    try:
        if AS_ROOT:
            probe = made.doctor("--help")
            if probe.returncode != 0:
                pytest.skip(f"setpriv cannot run doctor here: {probe.stderr[-200:]}")
        ready = made.doctor()
        assert ready.returncode == 0 and ready.stdout.splitlines()[0].endswith(": ready"), ready
        yield made
    finally:
        made.close()


def not_judged(stdout: str) -> list[str]:
    """What the 'Not judged' section lists."""
    lines = stdout.split("\nNot judged (could not be read or parsed): ", 1)
    return (
        [line.split(": ")[0].strip() for line in lines[1].splitlines()[1:]]
        if len(lines) > 1
        else []
    )


def not_ready(done: subprocess.CompletedProcess[str]) -> str:
    """doctor's answer is "cannot tell" (exit 5), with no traceback."""
    assert done.returncode == ExitCode.GAPS, (done.returncode, done.stdout[-2000:], done.stderr)
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr, done.stderr
    first = done.stdout.splitlines()[0]
    assert "cannot tell:" in first and "(not judged)" in first, first
    return first


# (A models folder listed but not searchable was noted already: each of its modules is read.)
@pytest.mark.parametrize(
    ("tree", "folder", "mode"),
    [
        ("0.5.9", MODELS, "none"),
        ("0.5.9", MODELS, "search only"),
        ("0.5.9", MOE, "none"),
        ("0.5.23", MOE, "search only"),
        ("0.5.9", MOE, "list only"),
        ("0.5.23", MOE, "list only"),
    ],
    indirect=["tree"],
)
def test_a_folder_doctor_cannot_read_is_not_judged(tree: Tree, folder: str, mode: str) -> None:
    """It said "ready", exit 0: the files in the folder were skipped in silence (the listing
    and git grep skipped the folder; a folder listed but not searchable, git grep skipped its
    files with a warning, and doctor took them for files holding nothing)."""
    tree.deny(folder, MODES[mode][0] if AS_ROOT else MODES[mode][1])
    done = tree.doctor()
    first = not_ready(done)
    listed = not_judged(done.stdout)
    if mode == "list only":  # its files are named, and none of them could be read
        assert listed and all(name.startswith(f"{folder}/") for name in listed), listed
        assert "files could not be read" in first or "1 file could not be read" in first, first
    else:
        assert listed == [f"{folder}/"], listed
        assert "1 folder could not be read or parsed (not judged)" in first, first
        assert f"  {folder}/: cannot be listed: Permission denied" in done.stdout
    data = json.loads(tree.doctor("--json").stdout)
    assert data["ready"] is False
    assert [entry["file"] for entry in data["not_judged"]] == listed


@pytest.mark.parametrize(
    ("tree", "model"),
    [("0.5.9", "kimi_k25"), ("0.5.23", "KimiK25ForConditionalGeneration")],
    indirect=["tree"],
)
def test_a_model_in_a_folder_doctor_cannot_read_is_not_judged(tree: Tree, model: str) -> None:
    """It was exit 70: `Path.is_file` raised PermissionError on the models module's name."""
    tree.deny(MODELS, MODES["none"][0] if AS_ROOT else MODES["none"][1])
    done = tree.doctor("--model", model)
    not_ready(done)
    assert f"EAGLE-3 on {model}: not judged ({MODELS}/ not read)" in done.stdout
    assert not_judged(done.stdout) == [f"{MODELS}/"]
    assert "for other models" not in done.stdout
    json_done = tree.doctor("--model", model, "--json")
    assert json_done.returncode == ExitCode.GAPS, json_done.stderr
    data = json.loads(json_done.stdout)
    assert data["ready"] is False and data["model"] is None
    assert [entry["file"] for entry in data["not_judged"]] == [f"{MODELS}/"]


@pytest.mark.parametrize("tree", ["0.5.9"], indirect=True)  # fixed upstream in 0.5.23
def test_a_model_whose_module_cannot_be_read_is_not_judged_for_it(tree: Tree) -> None:
    """Its patch (which cannot read the module either) was counted "for other models"."""
    tree.deny(KIMI, UNREADABLE_FILE)
    done = tree.doctor("--model", "kimi_k25")
    not_ready(done)
    assert not_judged(done.stdout) == [KIMI]
    assert "for other models" not in done.stdout, done.stdout
    assert "Not judged for kimi_k25 (its module could not be read): 1 pending patch" in done.stdout
    assert f"EAGLE-3 on kimi_k25: not judged ({KIMI} not read)" in done.stdout
    data = json.loads(tree.doctor("--model", "kimi_k25", "--json").stdout)
    assert KIMI_PATCH not in data["not_for_this_model"]
    assert data["not_judged_for_this_model"] == [KIMI_PATCH]
    assert data["ready"] is False


@pytest.mark.parametrize("tree", ["0.5.9"], indirect=True)
def test_a_package_folder_doctor_cannot_look_into_is_a_target_error(tree: Tree) -> None:
    """It was exit 70: `Path.is_file` raised PermissionError on `sglang/__init__.py` while the
    target was recognised. Nothing in it can be read: a one-line target error (exit 3)."""
    tree.deny("sglang", MODES["none"][0] if AS_ROOT else MODES["none"][1])
    done = tree.doctor()
    assert done.returncode == ExitCode.TARGET, (done.returncode, done.stderr)
    assert done.stdout == ""
    assert done.stderr.strip() == (
        f"sglpatch: error: {tree.site / 'sglang'}: cannot look into it: Permission denied"
    )


@pytest.mark.parametrize("tree", ["0.5.23"], indirect=True)
def test_a_pycache_folder_it_cannot_list_is_not_a_reason_to_doubt(tree: Tree) -> None:
    """A root-only `__pycache__` (root ran SGLang with umask 077) holds no source: it made a
    ready tree "cannot tell" (exit 5)."""
    for folder in ("sglang/srt/layers/__pycache__", "sglang/srt/models/__pycache__"):
        (tree.site / folder).mkdir(exist_ok=True)
        tree.deny(folder, MODES["none"][0 if AS_ROOT else 1])
    done = tree.doctor()
    assert done.returncode == 0 and done.stdout.splitlines()[0].endswith(": ready"), done.stdout
