"""sm120-nvfp4-moe-backend, proven against upstream's own fix (0.5.13) on the real wheels.

`ServerArgs._handle_moe_kernel_config` is executed from the wheel's (patched) source with
stand-ins for the capability helpers it reads; nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
import builtins
import itertools
from collections.abc import Mapping
from functools import cache
from types import CodeType
from typing import Any
from unittest import mock

import libcst as cst
import pytest
from packaging.version import Version

from sglpatch.patches.sm120_nvfp4_moe_backend import METHOD, Sm120Nvfp4MoeBackend
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120Nvfp4MoeBackend()
SERVER_ARGS = "sglang/srt/server_args.py"
FIXED = "0.5.13"  # the first release with upstream's branch
BROKEN = ["0.5.11", "0.5.12", "0.5.12.post1"]
QUANTIZATIONS = ["modelopt_fp4", "modelopt_fp8", "fp8", "mxfp8", None]
BACKENDS = ["auto", "triton", "flashinfer_cutlass", "flashinfer_trtllm", "cutlass"]


class _Capability(dict[str, Any]):
    """Module globals for the method: the capability helpers answer for one stand-in GPU."""

    def __init__(self, major: int, minor: int) -> None:
        super().__init__()
        self.update(
            is_sm120_supported=lambda *_: major == 12,
            is_sm100_supported=lambda *_: major == 10,
            is_sm90_supported=lambda *_: major == 9,
            is_blackwell_supported=lambda *_: major in (10, 12),
            get_device_sm=lambda: major * 10 + minor,
            get_device_capability=lambda *_: (major, minor),
            envs=mock.MagicMock(**{"SGLANG_CUTLASS_MOE.get.return_value": False}),
            logger=mock.MagicMock(),
        )

    def __missing__(self, name: str) -> Any:
        if hasattr(builtins, name):
            return getattr(builtins, name)
        raise NameError(f"the stand-in has no {name!r}: extend _Capability")


class _Args:
    """The ServerArgs fields the method reads."""

    def __init__(self, quantization: str | None, backend: str) -> None:
        self.quantization = quantization
        self.moe_runner_backend = backend
        self.ep_size = self.tp_size = 1
        self.moe_a2a_backend = "none"
        self.disable_shared_experts_fusion = False
        # 0.5.11-0.5.12.post1 end with a piecewise-CUDA-graph tweak that reads the model config;
        # enforcing piecewise graphs skips it (0.5.13 moved it out of this method).
        self.enforce_piecewise_cuda_graph = True
        self.disable_piecewise_cuda_graph = False

    def get_model_config(self) -> Any:
        # The inserted branch also reads the checkpoint's quantization (as
        # sm120-nvfp4-moe-checkpoint-quant widens 0.5.13's): here it says what the flag says,
        # the cases upstream's own test tells apart (the rest: that patch's tests).
        return mock.NonCallableMock(quantization=self.quantization)


@cache
def _method(source: bytes) -> CodeType:
    """The method alone, compiled once per source (the file is large; the grid is not)."""
    tree = syntax.tree(source)
    server_args = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    )
    method = next(
        n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == METHOD
    )
    return compile(ast.Module(body=[method], type_ignores=[]), SERVER_ARGS, "exec")


def resolve(
    source: bytes, capability: tuple[int, int], quantization: str | None, backend: str
) -> tuple[str, str | None]:
    """(the backend the method settles on, the assertion it raised or None)."""
    namespace = _Capability(*capability)
    exec(_method(source), namespace)
    args = _Args(quantization, backend)
    try:
        namespace[METHOD](args)
    except AssertionError as error:  # the method's own validation: part of what it chose
        return args.moe_runner_backend, f"AssertionError: {error}"
    return args.moe_runner_backend, None


GRID = list(itertools.product(QUANTIZATIONS, BACKENDS))


@pytest.mark.parametrize("release", BROKEN)
def test_unpatched_release_leaves_nvfp4_moe_on_auto_which_means_trtllm_gen(release: str) -> None:
    # `auto` stays `auto`, and the NVFP4 MoE method turns `auto` into FLASHINFER_TRTLLM.
    assert resolve(wheels.member(release, SERVER_ARGS), (12, 0), "modelopt_fp4", "auto") == (
        "auto",
        None,
    )
    method = wheels.member(release, "sglang/srt/layers/quantization/modelopt_quant.py").decode()
    assert "moe_runner_backend = MoeRunnerBackend.FLASHINFER_TRTLLM" in method


@pytest.mark.parametrize("capability", [(12, 0), (12, 1)])
@pytest.mark.parametrize("release", BROKEN)
def test_capability_12_chooses_what_the_fixing_release_chooses(
    release: str, capability: tuple[int, int]
) -> None:
    ours, upstream = wheels.patched(release, patch=PATCH), wheels.member(FIXED, SERVER_ARGS)
    assert resolve(ours, capability, "modelopt_fp4", "auto") == ("flashinfer_cutlass", None)
    for quantization, backend in GRID:
        assert resolve(ours, capability, quantization, backend) == resolve(
            upstream, capability, quantization, backend
        ), (quantization, backend)


@pytest.mark.parametrize("capability", [(8, 9), (9, 0), (10, 0)])
@pytest.mark.parametrize("release", BROKEN)
def test_other_capabilities_choose_exactly_what_they_chose(
    release: str, capability: tuple[int, int]
) -> None:
    ours, theirs = wheels.patched(release, patch=PATCH), wheels.member(release, SERVER_ARGS)
    for quantization, backend in GRID:
        assert resolve(ours, capability, quantization, backend) == resolve(
            theirs, capability, quantization, backend
        ), (quantization, backend)


@pytest.mark.parametrize("release", ["0.5.13", "0.5.14", "0.5.15", "0.5.19", "0.5.23"])
def test_from_0_5_13_the_branch_is_upstream_and_the_file_is_left_alone(release: str) -> None:
    wheels.assert_left_alone(PATCH, release)


def test_before_0_5_11_nvfp4_moe_never_defaulted_to_trtllm_gen() -> None:
    assert PATCH.target_file(Version("0.5.10.post1")) is None
    method = wheels.member("0.5.10.post1", "sglang/srt/layers/quantization/modelopt_quant.py")
    assert b"moe_runner_backend = MoeRunnerBackend.FLASHINFER_TRTLLM" not in method


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release < Version("0.5.11"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """On an SM120 stand-in, modelopt_fp4 + `auto` resolves to flashinfer_cutlass."""
    state = matrix_expected(release)
    if state == "not for this release":
        return
    path = f"sglang/{PATCH.target_file(release)}"
    source = patched.get(path, wheels.member(str(release), path))
    if path != SERVER_ARGS:  # 0.5.15+: upstream's resolution pass, recognised in place
        PATCH.postcondition(cst.parse_module(source), release)
        return
    for capability in [(12, 0), (12, 1)]:
        chosen = resolve(source, capability, "modelopt_fp4", "auto")
        if chosen != ("flashinfer_cutlass", None):
            raise AssertionError(f"{release} at {capability}: NVFP4 MoE `auto` -> {chosen}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
