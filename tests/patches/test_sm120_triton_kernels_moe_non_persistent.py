"""sm120-triton-kernels-moe-non-persistent, proven against upstream's own fix (0.5.17).

The whole `triton_kernels_moe.py` of a release (patched or not) is executed as its import would
run it, with every import served by a stand-in: the capability helpers are the release's own
(tests/support/stand_ins_moe.py), `update_opt_flags_constraints` records what it is asked for, anything
else is an inert mock. Nothing imports torch, triton_kernels or SGLang.
"""

from __future__ import annotations

import builtins
from collections.abc import Mapping
from typing import Any
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_triton_kernels_moe_non_persistent import (
    FIXED,
    TARGET,
    Sm120TritonKernelsMoeNonPersistent,
)
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120TritonKernelsMoeNonPersistent()
PATH = "sglang/srt/layers/moe/fused_moe_triton/triton_kernels_moe.py"
SWIZZLE = "sglang/srt/layers/quantization/mxfp4.py"
BROKEN = ["0.5.14", "0.5.15", "0.5.16"]
NON_PERSISTENT = [{"is_persistent": False}]
REAL_IMPORT = builtins.__import__


def import_time_constraints(
    source: bytes, release: str, capability: tuple[int, int]
) -> list[dict[str, Any]]:
    """What importing the module asks triton_kernels' opt_flags for, on a stand-in device."""
    asked: list[dict[str, Any]] = []
    served: dict[str, Any] = {
        **stand_ins.host_names(release, capability),
        "update_opt_flags_constraints": lambda constraints: asked.append(dict(constraints)),
    }

    def stand_in_import(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: tuple[str, ...] | None = (),
        level: int = 0,
    ) -> Any:
        if name in ("__future__", "typing"):
            return REAL_IMPORT(name, globals, locals, fromlist or (), level)
        module = mock.MagicMock(name=name)
        for wanted in fromlist or ():
            setattr(module, wanted, served.get(wanted, mock.MagicMock(name=wanted)))
        return module

    namespace: dict[str, Any] = {
        "__name__": "triton_kernels_moe_stand_in",
        "__builtins__": {**vars(builtins), "__import__": stand_in_import},
    }
    exec(compile(source, PATH, "exec"), namespace)
    return asked


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_unpatched_release_leaves_capability_12_on_the_persistent_kernel(
    release: str, capability: tuple[int, int]
) -> None:
    # Importing the MoE module constrains nothing ...
    assert import_time_constraints(wheels.member(release, PATH), release, capability) == []
    # ... and, unlike 0.5.10-0.5.13, the MXFP4 weight swizzle no longer does it either.
    swizzle = stand_ins.run_swizzle(wheels.member(release, SWIZZLE), release, capability)
    assert swizzle.constraints.get("is_persistent") is not False
    warps = {"_patch_sm120_mxfp4_min_warps": mock.Mock()}  # 0.5.12-0.5.13's num_warps floor
    older = stand_ins.run_swizzle(wheels.member("0.5.13", SWIZZLE), "0.5.13", capability, warps)
    assert older.constraints.get("is_persistent") is False


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_capability_12_asks_what_0_5_17_asks(release: str, capability: tuple[int, int]) -> None:
    fixed = str(FIXED)
    upstream = import_time_constraints(wheels.member(fixed, PATH), fixed, capability)
    assert upstream == NON_PERSISTENT
    assert (
        import_time_constraints(wheels.patched(release, patch=PATCH), release, capability)
        == upstream
    )


@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_other_capabilities_ask_what_they_asked(release: str, capability: tuple[int, int]) -> None:
    pristine = import_time_constraints(wheels.member(release, PATH), release, capability)
    assert (
        import_time_constraints(wheels.patched(release, patch=PATCH), release, capability)
        == pristine
        == []
    )


@pytest.mark.parametrize("release", ["0.5.17", "0.5.18", "0.5.19", "0.5.23"])
def test_from_0_5_17_the_constraint_is_upstream_and_the_file_is_left_alone(release: str) -> None:
    wheels.assert_left_alone(PATCH, release)


def matrix_expected(release: Version) -> str:
    if TARGET.get(release) is None:
        return "not for this release"
    return "applied" if release < FIXED else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    for capability in stand_ins.SM120:
        assert import_time_constraints(pristine[PATH], str(release), capability) == []


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On an SM120 stand-in, importing the module constrains matmul_ogs to non-persistent;
    where the patch applied, other capabilities are asked for nothing, as before."""
    name = str(release)
    source = patched.get(PATH, wheels.member(name, PATH))
    for capability in stand_ins.SM120:
        got = import_time_constraints(source, name, capability)
        if got != NON_PERSISTENT:
            raise AssertionError(f"{release} at {capability}: import asks for {got}")
    if release < FIXED:
        for capability in stand_ins.OTHERS:
            assert import_time_constraints(source, name, capability) == []


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
