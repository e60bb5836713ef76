"""DSA backends on capability 12: the patched passes give TileLang; 8.9/9.0/10.0 keep theirs."""

from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_dsa_backends import TARGET, Sm120DsaBackends
from tests.support import stand_ins_dsa, wheels
from tests.support import stand_ins_moe as stand_ins
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DsaBackends()
FIRST = Version("0.5.9")
# ServerArgs' nsa_* (0.5.9 without a ROCm arm, 0.5.10, 0.5.12) and dsa_* (0.5.13, 0.5.14)
# methods, then arg_groups/overrides.py.
# A release of each code shape (tests/test_matrix.py proves the effect on every release).
RELEASES = [
    "0.5.9",
    "0.5.10",
    "0.5.12",
    "0.5.13",
    "0.5.15",
    "0.5.16",
    "0.5.17",
    "0.5.20",
    "0.5.23",
]
DEEPSEEK_V3 = "DeepseekV3ForCausalLM"  # the DSA form (index_topk), DeepSeek-V3.2 before 0.5.12
DEEPSEEK = "DeepseekV32ForCausalLM"
GLM5 = "GlmMoeDsaForCausalLM"
GLM53_FLASH = "Glm5NextForConditionalGeneration"


SIDES = ("prefill", "decode")


def _runs_on_12(got: Mapping[str, str | None], release: str) -> None:
    """Both backends 12 gets run on 12.0 and 12.1, by the kernel-support table."""
    for side in SIDES:
        for capability in stand_ins.SM120:
            assert support.runs_on("dsa", got[side] or "", capability, release), (side, got)


def _path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


def _architectures(release: str) -> list[str]:
    names = [DEEPSEEK_V3, GLM5]
    if Version(release) >= Version("0.5.12"):  # the release's DSA arm lists it
        names.append(DEEPSEEK)
    return [*names, GLM53_FLASH] if Version(release) >= Version("0.5.20") else names


def resolve(
    source: bytes, release: str, capability: tuple[int, int], arch: str, kv: str = "auto"
) -> dict[str, str | None]:
    return stand_ins_dsa.resolve(source, release, capability, stand_ins_dsa.View(arch, kv))


def _glm_branch(release: str, arch: str) -> bool:
    """The release's own capability-12 GLM FP8 branch (0.5.17+): flashinfer_sparse_mla."""
    return arch == GLM5 and Version(release) >= Version("0.5.17")


def matrix_expected(release: Version) -> str:
    return "applied" if release >= FIRST else "not for this release"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, DeepSeek-V3.2 on capability 12 gets trtllm for prefill and decode (FlashMLA's
    flashmla_auto and flashmla_kv in 0.5.9): the table says they do not run there."""
    name = str(release)
    source = pristine[_path(name)]
    for capability in stand_ins.SM120:
        got = resolve(source, name, capability, DEEPSEEK_V3)
        expected = (
            ("flashmla_auto", "flashmla_kv") if release < Version("0.5.10") else ("trtllm",) * 2
        )
        assert (got["prefill"], got["decode"]) == expected, got
        assert all(support.runs_on("dsa", b, capability, name) is False for b in expected)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[_path(name)]
    pristine = wheels.member(name, _path(name))
    for arch in _architectures(name):
        for capability in stand_ins.SM120:
            got = resolve(source, name, capability, arch)
            if _glm_branch(name, arch):
                assert got["prefill"] == got["decode"] == "flashinfer_sparse_mla", got
            else:
                assert got["prefill"] == got["decode"] == "tilelang", (arch, capability, got)
            _runs_on_12(got, name)
        for capability in stand_ins.OTHERS:
            assert resolve(source, name, capability, arch) == resolve(
                pristine, name, capability, arch
            )


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_unpatched_capability_12_gets_backends_that_do_not_run_there(
    release: str, capability: tuple[int, int]
) -> None:
    pristine = wheels.member(release, _path(release))
    for arch in _architectures(release):
        for kv in ("auto", "bfloat16"):
            got = resolve(pristine, release, capability, arch, kv)
            if _glm_branch(release, arch) and got["kv_cache_dtype"] == "fp8_e4m3":
                continue  # upstream's own capability-12 branch
            runs = [support.runs_on("dsa", got[side] or "", capability, release) for side in SIDES]
            assert False in runs, (arch, kv, got)  # the table: one of them cannot run on 12


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_gets_tilelang_with_a_kv_cache_it_reads(
    release: str, capability: tuple[int, int]
) -> None:
    for arch in _architectures(release):
        got = resolve(wheels.patched(release, patch=PATCH), release, capability, arch)
        if _glm_branch(release, arch):
            assert got == {
                "kv_cache_dtype": "fp8_e4m3",
                "prefill": "flashinfer_sparse_mla",
                "decode": "flashinfer_sparse_mla",
            }
            continue
        # CUDA TileLang reads bfloat16 KV only until 0.5.22; 0.5.23 has an FP8-KV kernel.
        kv = "fp8_e4m3" if Version(release) >= Version("0.5.23") else "bfloat16"
        assert got == {"kv_cache_dtype": kv, "prefill": "tilelang", "decode": "tilelang"}
        _runs_on_12(got, release)
        bf16 = resolve(wheels.patched(release, patch=PATCH), release, capability, arch, "bfloat16")
        assert bf16 == {"kv_cache_dtype": "bfloat16", "prefill": "tilelang", "decode": "tilelang"}


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("kv", ["auto", "bfloat16", "fp8_e4m3"])
def test_other_capabilities_get_what_they_got(
    release: str, capability: tuple[int, int], kv: str
) -> None:
    pristine = wheels.member(release, _path(release))
    for arch in _architectures(release):
        assert resolve(
            wheels.patched(release, patch=PATCH), release, capability, arch, kv
        ) == resolve(pristine, release, capability, arch, kv)


@pytest.mark.parametrize("release", ["0.5.9", "0.5.12", "0.5.14", "0.5.22"])
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_a_backend_the_user_chose_is_kept(release: str, capability: tuple[int, int]) -> None:
    view = stand_ins_dsa.View(DEEPSEEK_V3, "bfloat16", dsa_decode_backend="flashmla_sparse")
    got = stand_ins_dsa.resolve(wheels.patched(release, patch=PATCH), release, capability, view)
    assert got == {"kv_cache_dtype": "bfloat16", "prefill": "tilelang", "decode": "flashmla_sparse"}


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
