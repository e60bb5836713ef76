"""Every release from 0.5.3 to the newest: apply, prove, exercise, revert byte-exact.

What each patch must do, and how its effect is proven, lives beside the patch's own tests:
`tests/patches/test_<module>.py` defines

- `matrix_expected(release) -> str`: "applied", "already upstream" or "not for this release",
  read off the wheels by hand;
- `matrix_effect(release, patched)`: asserts the patch's effect, given the patched wheel members
  (keyed by wheel path, "sglang/srt/...") of a release where it was applied or is upstream;
- optionally `matrix_symptom(release, pristine)`: asserts the bug is real on an unpatched release
  where the patch applies.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from types import ModuleType

import pytest
from packaging.version import Version

from sglpatch import api, catalogue
from tests import wheels
from tests.conftest import snapshot

pytestmark = pytest.mark.wheel


def _hooks() -> dict[str, ModuleType]:
    return {
        patch.id: importlib.import_module(
            f"tests.patches.test_{type(patch).__module__.rsplit('.', 1)[1]}"
        )
        for patch in catalogue.load()
    }


HOOKS = _hooks()


def test_every_patch_declares_its_matrix_hooks() -> None:
    for patch_id, module in HOOKS.items():
        assert callable(getattr(module, "matrix_expected", None)), patch_id
        assert callable(getattr(module, "matrix_effect", None)), patch_id


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_release(release: str, tmp_path: Path) -> None:
    version = Version(release)
    site = wheels.site_packages(release, tmp_path / "site", wheels.patch_targets(release))
    pristine = snapshot(site)
    expected = {patch_id: hooks.matrix_expected(version) for patch_id, hooks in HOOKS.items()}

    # The bug is real on this release wherever a patch is due.
    for patch_id, hooks in HOOKS.items():
        if expected[patch_id] == "applied" and hasattr(hooks, "matrix_symptom"):
            hooks.matrix_symptom(version, pristine)

    report = api.apply(site, None)
    states = {o.patch_id: o.state for o in report.outcomes}
    assert states == expected
    # `list --release` predicts it without reading any file.
    outlooks = {row.id: row.outlook or "" for row in api.list_patches(release)}
    for patch_id, state in states.items():
        assert outlooks[patch_id].startswith("applies" if state == "applied" else state)
    patched = snapshot(site)
    touched = {k for k in pristine if pristine[k] != patched[k]}
    assert touched == {o.file for o in report.outcomes if o.state == "applied"}

    # Exercise the result.
    for patch_id, hooks in HOOKS.items():
        if expected[patch_id] != "not for this release":
            hooks.matrix_effect(version, patched)

    statuses = {row.id: row.state for row in api.status(site).patches}
    assert statuses == expected

    api.revert(site)
    assert snapshot(site) == pristine
    for member in wheels.patch_targets(release):
        assert (site / member).read_bytes() == wheels.member(release, member)
