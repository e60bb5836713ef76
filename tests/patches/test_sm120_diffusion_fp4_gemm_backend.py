"""sm120-diffusion-fp4-gemm-backend, proven against upstream's own fix (0.5.19) on the real wheels.

`CudaPlatformBase.get_modelopt_flashinfer_fp4_backend` is cut out of the release's (patched)
cuda.py and run as a method of a stand-in platform whose `is_sm120` is the release's own
`Platform.is_sm120` (interface.py), compiled against a stand-in `torch.cuda` of the given
capability. Nothing imports torch or FlashInfer.
"""

from __future__ import annotations

import ast
import logging
import types
from collections.abc import Mapping
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_diffusion_fp4_gemm_backend import (
    CLASS,
    FIXED,
    METHOD,
    Sm120DiffusionFp4GemmBackend,
)
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DiffusionFp4GemmBackend()
PATH = "sglang/multimodal_gen/runtime/platforms/cuda.py"
INTERFACE = "sglang/multimodal_gen/runtime/platforms/interface.py"
FIRST = "0.5.13"  # the first release whose default is "trtllm" on every GPU
APPLIED = ["0.5.13", "0.5.15.post1", "0.5.17", "0.5.18"]
SM120 = [(12, 0), (12, 1)]
OTHERS = [(8, 9), (9, 0), (10, 0), (10, 3)]


def _method(source: bytes, owner: str, name: str) -> ast.FunctionDef:
    tree = ast.parse(source)
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    (found,) = [n for n in body if isinstance(n, ast.FunctionDef) and n.name == name]
    found.decorator_list = []
    return found


def _compiled(node: ast.FunctionDef, names: dict[str, Any]) -> Any:
    exec(compile(ast.Module(body=[node], type_ignores=[]), "<stand-in>", "exec"), names)
    return names[node.name]


def backend(
    source: bytes, release: str, capability: tuple[int, int], requested: str | None = None
) -> str:
    """What the release's method returns on a CUDA GPU of `capability` (env var: `requested`);
    the platform's `is_blackwell` (0.5.12.post1's default reads it) and `is_sm120` are the
    release's own."""
    torch = types.SimpleNamespace(
        cuda=types.SimpleNamespace(get_device_capability=lambda device=None: capability)
    )
    interface = wheels.member(release, INTERFACE)
    predicates = {
        name: classmethod(_compiled(_method(interface, "Platform", name), {"torch": torch}))
        for name in ("is_blackwell", "is_sm120")
    }
    platform = type(
        "StandInCudaPlatform", (), {**predicates, "is_cuda_static": classmethod(lambda cls: True)}
    )
    names = {
        "envs": types.SimpleNamespace(SGLANG_DIFFUSION_FLASHINFER_FP4_GEMM_BACKEND=requested),
        "logger": logging.getLogger("sglpatch.stand_in"),
        "torch": torch,
    }
    result = _compiled(_method(source, CLASS, METHOD), names)(platform)
    assert isinstance(result, str)
    return result


@pytest.mark.parametrize("capability", SM120, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_unpatched_release_gives_capability_12_trtllm(
    release: str, capability: tuple[int, int]
) -> None:
    # ...which is what the NVFP4 linear layer hands to flashinfer.mm_fp4 as its backend.
    assert backend(wheels.member(release, PATH), release, capability) == "trtllm"


@pytest.mark.parametrize("capability", SM120, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_capability_12_gets_auto_like_the_fixing_release(
    release: str, capability: tuple[int, int]
) -> None:
    ours = backend(wheels.patched(release, patch=PATCH), release, capability)
    upstream = backend(wheels.member(str(FIXED), PATH), str(FIXED), capability)
    assert ours == upstream == "auto"


@pytest.mark.parametrize("capability", OTHERS, ids=str)
@pytest.mark.parametrize("release", APPLIED)
def test_other_capabilities_keep_trtllm(release: str, capability: tuple[int, int]) -> None:
    ours = backend(wheels.patched(release, patch=PATCH), release, capability)
    assert ours == backend(wheels.member(release, PATH), release, capability) == "trtllm"
    assert ours == backend(wheels.member(str(FIXED), PATH), str(FIXED), capability)


@pytest.mark.parametrize("requested", ["flashinfer_cudnn", "cutlass", "trtllm", "auto"])
def test_an_explicit_backend_is_left_as_asked(requested: str) -> None:
    ours = backend(wheels.patched("0.5.18", patch=PATCH), "0.5.18", (12, 0), requested)
    assert ours == backend(wheels.member("0.5.18", PATH), "0.5.18", (12, 0), requested)
    # An unknown name falls back to the default, which is now `auto` on 12.
    assert backend(wheels.patched("0.5.18", patch=PATCH), "0.5.18", (12, 0), "bogus") == "auto"


def test_0_5_12_post1_already_gave_capability_12_auto() -> None:
    # Its default was `cudnn` on capability 10 only (multimodal_gen's is_blackwell is major == 10).
    assert backend(wheels.member("0.5.12.post1", PATH), "0.5.12.post1", (12, 0)) == "auto"
    assert PATCH.target_file(Version("0.5.12.post1")) is None


def test_0_5_19_is_left_alone() -> None:
    wheels.assert_left_alone(PATCH, str(FIXED))


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    if release < Version(FIRST):
        return "not for this release"
    return "applied" if release < FIXED else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Capability 12.0 and 12.1 get `auto`, 10.0 keeps `trtllm`."""
    if matrix_expected(release) == "not for this release":
        return
    source = patched.get(PATH, wheels.member(str(release), PATH))
    for capability, wanted in [((12, 0), "auto"), ((12, 1), "auto"), ((10, 0), "trtllm")]:
        got = backend(source, str(release), capability)
        if got != wanted:
            raise AssertionError(f"{release}: diffusion FP4 GEMM backend {got} at {capability}")


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 gets FlashInfer's SM100-only TRT-LLM FP4 GEMM."""
    if backend(pristine.get(PATH, wheels.member(str(release), PATH)), str(release), (12, 0)) != (
        "trtllm"
    ):
        raise AssertionError(f"{release}: capability 12 does not get trtllm")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
