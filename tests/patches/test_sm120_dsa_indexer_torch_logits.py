"""The DSA indexer's DeepGEMM calls on 0.5.9 - 0.5.21: every call site of the real tree lands
on the shim's torch code on capability 12 and on DeepGEMM elsewhere (tests/support/deep_gemm_shim).

That the torch code computes what 0.5.22's torch path computes is
`test_sm120_dsa_indexer_torch_logits_numerics.py` (it needs torch; CI skips it).
"""

from __future__ import annotations

import functools

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.sm120_dsa_indexer_torch_logits import TARGET, Sm120DsaIndexerTorchLogits
from sglpatch.results import AlreadyApplied
from tests.support import deep_gemm_shim as shim
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DsaIndexerTorchLogits()
# The DeepGEMM functions the indexer reads on every release (its prefill and decode logits,
# the schedule and the SM count).
USES = set(shim.ROUTED)


@pytest.mark.parametrize("release", shim.RELEASES)
def test_every_call_site_of_the_tree_is_listed_and_kept(release: str) -> None:
    before = shim.call_sites(shim.pristine(PATCH, release))
    after = shim.call_sites(wheels.patched(release, patch=PATCH))
    assert {s.name for s in before} == USES
    assert [s.name for s in after] == [s.name for s in before]
    # the indexer reads its module global: no method imports DeepGEMM itself
    assert all(s.scope is None for s in before)


@pytest.mark.parametrize("release", shim.RELEASES)
def test_unpatched_capability_12_reaches_deep_gemm(release: str) -> None:
    name = shim.path(PATCH, release)
    shim.symptom(PATCH, Version(release), {name: shim.pristine(PATCH, release)})


@pytest.mark.parametrize("release", shim.RELEASES)
def test_capability_12_takes_the_torch_code_and_others_deep_gemm(release: str) -> None:
    name = shim.path(PATCH, release)
    shim.effect(PATCH, Version(release), {name: wheels.patched(release, patch=PATCH)})


@pytest.mark.parametrize("release", ["0.5.9", "0.5.13", "0.5.21"])
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize(
    ("variable", "lands"),
    [("0", "deep_gemm"), ("false", "deep_gemm"), ("1", "torch"), ("TRUE", "torch")],
)
def test_a_users_setting_on_12_is_kept(
    release: str, capability: tuple[int, int], variable: str, lands: str
) -> None:
    # SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=0: a DeepGEMM with SM120 MQA-logits kernels
    landing = shim.land(wheels.patched(release, patch=PATCH), release, capability, variable)
    assert shim.everywhere(landing) == {lands}


@pytest.mark.parametrize("release", ["0.5.9", "0.5.13", "0.5.21"])
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
def test_the_variable_does_not_move_other_capabilities(
    release: str, capability: tuple[int, int]
) -> None:
    # these releases never read it: only 12 is given a meaning for it, 0.5.22's
    landing = shim.land(wheels.patched(release, patch=PATCH), release, capability, "1")
    assert shim.everywhere(landing) == {"deep_gemm"}


@pytest.mark.parametrize("release", ["0.5.9", "0.5.21"])
def test_rocm_reporting_major_12_is_untouched(release: str) -> None:
    # gfx1250 reports major 12; the release's own is_cuda() is False there
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


@pytest.mark.parametrize("release", ["0.5.8.post1", "0.5.22", "0.5.23"])
def test_not_for_releases_outside_the_range(release: str) -> None:
    assert TARGET.get(Version(release)) is None


MATRIX = MatrixHooks(
    shim.expected,
    functools.partial(shim.effect, PATCH),
    functools.partial(shim.symptom, PATCH),
)
