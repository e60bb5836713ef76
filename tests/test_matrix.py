"""Every release from 0.5.3 to the newest: apply, prove, exercise, revert byte-exact.

What each patch must do, and how its effect is proven, lives beside the patch's own tests:
`tests/patches/test_<module>.py` declares `MATRIX`, a `tests.support.matrix.MatrixHooks`.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
from packaging.version import Version

from sglpatch import api, catalogue
from tests.conftest import snapshot
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel


def _hooks() -> dict[str, MatrixHooks]:
    found = {}
    for patch in catalogue.load():
        module = importlib.import_module(
            f"tests.patches.test_{type(patch).__module__.rsplit('.', 1)[1]}"
        )
        found[patch.id] = getattr(module, "MATRIX", None)
    return found  # type: ignore[return-value]  # checked by the test below


HOOKS = _hooks()


def test_every_patch_declares_its_matrix_hooks() -> None:
    for patch_id, hooks in HOOKS.items():
        assert isinstance(hooks, MatrixHooks), patch_id


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_release(release: str, tmp_path: Path) -> None:
    version = Version(release)
    site = wheels.site_packages(release, tmp_path / "site", wheels.patch_targets(release))
    pristine = snapshot(site)
    expected = {patch_id: hooks.expected(version) for patch_id, hooks in HOOKS.items()}

    # The bug is real on this release wherever a patch is due.
    for patch_id, hooks in HOOKS.items():
        if expected[patch_id] == "applied" and hooks.symptom is not None:
            hooks.symptom(version, pristine)

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
            hooks.effect(version, patched)

    statuses = {row.id: row.state for row in api.status(site).patches}
    assert statuses == expected

    api.revert(site)
    assert snapshot(site) == pristine
    for member in wheels.patch_targets(release):
        assert (site / member).read_bytes() == wheels.member(release, member)
