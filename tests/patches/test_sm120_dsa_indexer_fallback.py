"""The DSA indexer's MQA-logits choice on capability 12: the patched release code takes its torch
path; 8.9/9.0/10.0 and ROCm keep what they had; a user's explicit setting is kept.

The choice is run from the release's own `srt/layers/attention/dsa/utils.py` (patched or not):
`_use_torch_mqa_logits` and the four `resolve_*` functions the indexer and the DSA backend call,
with the release's own `is_cuda` on a stand-in device, the release's default for the variable,
and stand-in `deep_gemm` and DSv4 kernel modules whose functions are recognised by identity.
"""

from __future__ import annotations

import ast
import functools
import sys
import types
from collections.abc import Mapping
from typing import Any
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_dsa_indexer_fallback import TARGET, Sm120DsaIndexerFallback
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks
from tests.support.stand_in_machine import env_defaults

pytestmark = pytest.mark.wheel

PATCH = Sm120DsaIndexerFallback()
FIRST = Version("0.5.22")
RELEASES = ["0.5.22", "0.5.23"]
VARIABLE = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
# What the indexer and the DSA backend ask dsa/utils.py for.
RESOLVERS = (
    "resolve_num_sms",
    "resolve_paged_mqa_logits_metadata_fn",
    "resolve_fp8_paged_mqa_logits_fn",
    "resolve_fp8_mqa_logits_fn",
)
LOADED = ("_use_torch_mqa_logits", "_fp8_paged_mqa_logits_torch", "_fp8_mqa_logits_torch")
DEVICE_SMS, DEEP_GEMM_SMS = 170, 188  # the stand-in device's count, and DeepGEMM's answer
TORCH_PATH = {
    "num_sms": "device",
    "metadata": "sglang",
    "paged": "torch",
    "ragged": "torch",
}
DEEP_GEMM_PATH = {
    "num_sms": "deep_gemm",
    "metadata": "deep_gemm",
    "paged": "deep_gemm",
    "ragged": "deep_gemm",
}


def _path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


class _Variable:
    def __init__(self, value: bool | None, default: bool) -> None:
        self.value, self.default = value, default

    def get(self) -> bool:
        return self.default if self.value is None else self.value

    def is_set(self) -> bool:
        return self.value is not None


class _Envs:
    """`envs` with the one variable these functions read; any other name is an error."""

    def __init__(self, variable: _Variable) -> None:
        setattr(self, VARIABLE, variable)


def _function(name: str) -> types.FunctionType:
    def run(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"{name} was called, not only chosen")

    run.__name__ = name
    return run  # type: ignore[return-value]


def _stand_in_modules() -> dict[str, types.ModuleType]:
    deep_gemm = types.ModuleType("deep_gemm")
    for name in ("fp8_mqa_logits", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata"):
        setattr(deep_gemm, name, _function(f"deep_gemm.{name}"))
    deep_gemm.get_num_sms = lambda: DEEP_GEMM_SMS  # type: ignore[attr-defined]
    dsv4 = "sglang.kernels.ops.attention.dsv4"
    modules = {"deep_gemm": deep_gemm}
    parts = dsv4.split(".")
    for i in range(1, len(parts) + 1):
        modules[".".join(parts[:i])] = types.ModuleType(".".join(parts[:i]))
    modules[dsv4].get_paged_mqa_logits_metadata = _function(  # type: ignore[attr-defined]
        "sglang.get_paged_mqa_logits_metadata"
    )
    return modules


def _torch(capability: tuple[int, int], hip: bool) -> types.SimpleNamespace:
    torch = stand_ins.stand_in_torch(capability)
    if hip:
        torch.version = types.SimpleNamespace(cuda=None, hip="7.0")
    torch.cuda.current_device = lambda: 0
    torch.cuda.get_device_properties = lambda index: types.SimpleNamespace(
        multi_processor_count=DEVICE_SMS
    )
    return torch


def choice(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    user: bool | None = None,
    hip: bool = False,
) -> dict[str, str]:
    """What the indexer is handed on this device: DeepGEMM's functions or the torch path's."""
    torch = _torch(capability, hip)
    with mock.patch.object(stand_ins, "stand_in_torch", lambda c, cuda="12.8": torch):
        is_cuda = stand_ins.device_predicates(release, capability)["is_cuda"]
    default = env_defaults(release)[VARIABLE]
    assert default is False  # EnvBool(False): the torch path is opt-in upstream
    names: dict[str, Any] = {
        "torch": torch,
        "envs": _Envs(_Variable(user, default)),
        "is_cuda": is_cuda,
        "lru_cache": functools.lru_cache,
    }
    wanted = set(RESOLVERS) | set(LOADED)
    body = [
        node
        for node in syntax.tree(source).body
        if isinstance(node, ast.FunctionDef) and node.name in wanted
    ]
    assert {node.name for node in body} == wanted
    exec(compile(ast.Module(body=body, type_ignores=[]), _path(release), "exec"), names)
    modules = _stand_in_modules()
    with mock.patch.dict(sys.modules, modules):
        sms = names["resolve_num_sms"]()
        metadata = names["resolve_paged_mqa_logits_metadata_fn"]()
        paged = names["resolve_fp8_paged_mqa_logits_fn"]()
        ragged = names["resolve_fp8_mqa_logits_fn"]()
    deep_gemm = modules["deep_gemm"]
    return {
        "num_sms": {DEVICE_SMS: "device", DEEP_GEMM_SMS: "deep_gemm"}[sms],
        "metadata": {
            deep_gemm.get_paged_mqa_logits_metadata: "deep_gemm",
            modules["sglang.kernels.ops.attention.dsv4"].get_paged_mqa_logits_metadata: "sglang",
        }[metadata],
        "paged": {
            deep_gemm.fp8_paged_mqa_logits: "deep_gemm",
            names["_fp8_paged_mqa_logits_torch"]: "torch",
        }[paged],
        "ragged": {
            deep_gemm.fp8_mqa_logits: "deep_gemm",
            names["_fp8_mqa_logits_torch"]: "torch",
        }[ragged],
    }


def matrix_expected(release: Version) -> str:
    return "applied" if release >= FIRST else "not for this release"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 is handed DeepGEMM's MQA-logits functions."""
    name = str(release)
    for capability in stand_ins.SM120:
        assert choice(pristine[_path(name)], name, capability) == DEEP_GEMM_PATH


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[_path(name)]
    pristine = wheels.member(name, _path(name))
    for capability in stand_ins.SM120:
        assert choice(source, name, capability) == TORCH_PATH
    for capability in stand_ins.OTHERS:
        assert choice(source, name, capability) == choice(pristine, name, capability)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_unpatched_capability_12_is_handed_deep_gemm(
    release: str, capability: tuple[int, int]
) -> None:
    assert choice(wheels.member(release, _path(release)), release, capability) == DEEP_GEMM_PATH


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_takes_the_torch_path_without_the_variable(
    release: str, capability: tuple[int, int]
) -> None:
    assert choice(wheels.patched(release, patch=PATCH), release, capability) == TORCH_PATH


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_a_users_setting_on_12_is_kept(release: str, capability: tuple[int, int]) -> None:
    # SGLANG_FP8_PAGED_MQA_LOGITS_TORCH=0: a DeepGEMM with SM120 MQA-logits kernels
    assert (
        choice(wheels.patched(release, patch=PATCH), release, capability, user=False)
        == DEEP_GEMM_PATH
    )
    assert (
        choice(wheels.patched(release, patch=PATCH), release, capability, user=True) == TORCH_PATH
    )


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("user", [None, False, True])
def test_other_capabilities_get_what_they_got(
    release: str, capability: tuple[int, int], user: bool | None
) -> None:
    pristine = wheels.member(release, _path(release))
    got = choice(wheels.patched(release, patch=PATCH), release, capability, user)
    assert got == choice(pristine, release, capability, user)
    assert got == (TORCH_PATH if user else DEEP_GEMM_PATH)


@pytest.mark.parametrize("release", RELEASES)
def test_rocm_reporting_major_12_is_untouched(release: str) -> None:
    # gfx1250 reports major 12; the release's own is_cuda() is False there
    got = choice(wheels.patched(release, patch=PATCH), release, (12, 5), hip=True)
    assert got == choice(wheels.member(release, _path(release)), release, (12, 5), hip=True)
    assert got == DEEP_GEMM_PATH


@pytest.mark.parametrize("release", ["0.5.9", "0.5.12", "0.5.13", "0.5.17", "0.5.20", "0.5.21"])
def test_earlier_indexers_have_no_path_off_deep_gemm(release: str) -> None:
    """Why the patch stops at 0.5.22: the indexer calls DeepGEMM's MQA-logits kernels directly
    and reads no variable that could send it elsewhere (sm120-dsa-indexer-torch-logits is the
    backport there)."""
    assert TARGET.get(Version(release)) is None
    folder = "dsa" if Version(release) >= Version("0.5.13") else "nsa"
    indexer = f"sglang/srt/layers/attention/{folder}/{folder}_indexer.py"
    tree = syntax.tree(wheels.member(release, indexer))
    calls = {
        f"{node.value.id}.{node.attr}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
    }
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    assert {"deep_gemm.fp8_mqa_logits", "deep_gemm.fp8_paged_mqa_logits"} <= calls
    assert f"envs.{VARIABLE}" not in calls
    assert not {"resolve_fp8_mqa_logits_fn", "resolve_fp8_paged_mqa_logits_fn"} & names


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
