"""Every release from 0.5.3 to the newest: apply, prove, exercise, revert byte-exact."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.version import Version

from sglpatch import api
from sglpatch.patches.kimi_k25_eagle3_interface import CLASS, METHODS
from tests import proofs, wheels
from tests.conftest import snapshot

pytestmark = pytest.mark.wheel

SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
KIMI = "sglang/srt/models/kimi_k25.py"


def expected(release: Version) -> dict[str, str]:
    """What each patch must do on `release`, read off the wheels by hand."""
    return {
        "sm120-symm-mem-sizes": "applied",  # no release up to 0.5.23 has a row for 12
        "sm120-symm-mem-two-shot": "applied" if release < Version("0.5.14") else "already upstream",
        "kimi-k25-eagle3-interface": (
            "not for this release" if release < Version("0.5.9")
            else "applied" if release == Version("0.5.9")
            else "already upstream"
        ),
    }  # fmt: skip


def communicator(release: str) -> tuple[str, str]:
    members = wheels.patch_targets(release)
    torch_path = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
    if torch_path in members:
        return torch_path, "TorchSymmMemCommunicator"
    return "sglang/srt/distributed/device_communicators/symm_mem.py", "SymmMemCommunicator"


@pytest.mark.parametrize("release", wheels.RELEASES)
def test_release(release: str, tmp_path: Path) -> None:
    version = Version(release)
    site = wheels.site_packages(release, tmp_path / "site", wheels.patch_targets(release))
    pristine = snapshot(site)
    comm_path, comm_class = communicator(release)
    table = (
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
        if b"TORCH_SYMM" in pristine[SIZES]
        else "SYMM_MEM_ALL_REDUCE_MAX_SIZES"
    )

    # The bug is real on this release: capability 12 crashes (or, from 0.5.14, is turned away).
    if version < Version("0.5.14"):
        with pytest.raises(KeyError, match="12"):
            proofs.communicator_run(pristine[comm_path], pristine[SIZES], comm_class, 12, 8)
    else:
        assert not proofs.communicator_run(
            pristine[comm_path], pristine[SIZES], comm_class, 12, 8
        ).enabled

    report = api.apply(site, None)
    states = {o.patch_id: o.state for o in report.outcomes}
    assert states == expected(version)
    # `list --release` predicts it without reading any file.
    outlooks = {row.id: row.outlook or "" for row in api.list_patches(release)}
    for patch_id, state in states.items():
        assert outlooks[patch_id].startswith("applies" if state == "applied" else state)
    patched = snapshot(site)
    touched = {k for k in pristine if pristine[k] != patched[k]}
    assert touched == {o.file for o in report.outcomes if o.state == "applied"}

    # Exercise the result.
    sizes = proofs.size_table(patched[SIZES], table)
    assert sizes[12] == sizes[10]
    run = proofs.communicator_run(patched[comm_path], patched[SIZES], comm_class, 12, 8)
    assert run.enabled and run.kernel == "two_shot" and run.max_size == sizes[10][8]
    assert (
        proofs.communicator_run(patched[comm_path], patched[SIZES], comm_class, 10, 8).kernel
        == "multimem"
    )
    if KIMI in patched:
        calls = proofs.drive_eagle3_interface(proofs.model_methods(patched[KIMI], CLASS, METHODS))
        assert calls["returned"] == ("embed", "head")
        calls["language_model"].set_embed_and_head.assert_called_once_with("new-embed", "new-head")

    statuses = {row.id: row.state for row in api.status(site).patches}
    assert statuses == expected(version)

    api.revert(site)
    assert snapshot(site) == pristine
    for member in wheels.patch_targets(release):
        assert (site / member).read_bytes() == wheels.member(release, member)
