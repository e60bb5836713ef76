"""The DSA backend's DeepGEMM schedule calls on 0.5.9 - 0.5.21: every call site of the real tree
lands on the shim's torch code on capability 12 and on DeepGEMM elsewhere, including the
method-local imports of 0.5.9 - 0.5.12 (tests/support/deep_gemm_shim)."""

from __future__ import annotations

import functools

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.sm120_dsa_backend_torch_schedule import TARGET, Sm120DsaBackendTorchSchedule
from sglpatch.patches.sm120_dsa_indexer_torch_logits import SHIM_CODE
from sglpatch.results import AlreadyApplied
from tests.support import deep_gemm_shim as shim
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DsaBackendTorchSchedule()
METHOD_IMPORTS = Version("0.5.13")  # before, each method imports DeepGEMM itself


@pytest.mark.parametrize("release", shim.RELEASES)
def test_every_call_site_of_the_tree_is_listed_and_kept(release: str) -> None:
    before = shim.call_sites(shim.pristine(PATCH, release))
    after = shim.call_sites(wheels.patched(release, patch=PATCH))
    assert {s.name for s in before} == {"get_paged_mqa_logits_metadata", "get_num_sms"}
    assert [s.name for s in after] == [s.name for s in before]
    local = Version(release) < METHOD_IMPORTS
    assert all((s.scope is not None) == local for s in before)


@pytest.mark.parametrize("release", shim.RELEASES)
def test_unpatched_capability_12_reaches_deep_gemm(release: str) -> None:
    name = shim.path(PATCH, release)
    shim.symptom(PATCH, Version(release), {name: shim.pristine(PATCH, release)})


@pytest.mark.parametrize("release", shim.RELEASES)
def test_capability_12_takes_the_torch_code_and_others_deep_gemm(release: str) -> None:
    name = shim.path(PATCH, release)
    shim.effect(PATCH, Version(release), {name: wheels.patched(release, patch=PATCH)})


@pytest.mark.parametrize("release", ["0.5.9", "0.5.21"])
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize(("variable", "lands"), [("0", "deep_gemm"), ("1", "torch")])
def test_a_users_setting_on_12_is_kept(
    release: str, capability: tuple[int, int], variable: str, lands: str
) -> None:
    landing = shim.land(wheels.patched(release, patch=PATCH), release, capability, variable)
    assert shim.everywhere(landing) == {lands}


@pytest.mark.parametrize("release", ["0.5.9", "0.5.21"])
def test_rocm_reporting_major_12_is_untouched(release: str) -> None:
    landing = shim.land(wheels.patched(release, patch=PATCH), release, (12, 5), hip=True)
    assert shim.everywhere(landing) == {"deep_gemm"}


@pytest.mark.parametrize("release", ["0.5.9", "0.5.12", "0.5.13", "0.5.21"])
def test_idempotent_and_postcondition_holds(release: str) -> None:
    source, version = wheels.patched(release, patch=PATCH), Version(release)
    again, outcomes = engine.transform_source(source, shim.path(PATCH, release), [PATCH], version)
    assert again is None and isinstance(outcomes[PATCH.id], AlreadyApplied)
    module = engine.parse(source)
    assert not isinstance(module, str)
    PATCH.postcondition(module, version)
    assert SHIM_CODE.splitlines()[0] in source.decode()  # the indexer's class, word for word


@pytest.mark.parametrize("release", ["0.5.8.post1", "0.5.22", "0.5.23"])
def test_not_for_releases_outside_the_range(release: str) -> None:
    assert TARGET.get(Version(release)) is None


MATRIX = MatrixHooks(
    shim.expected,
    functools.partial(shim.effect, PATCH),
    functools.partial(shim.symptom, PATCH),
)
