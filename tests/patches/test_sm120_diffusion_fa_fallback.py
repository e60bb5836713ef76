"""sm120-diffusion-fa-fallback, proven against upstream's own fix (0.5.8) on the real wheels.

`CudaPlatformBase.get_attn_backend_cls_str` is cut out of the release's (patched) cuda.py and
run on a stand-in device: the capability predicates are the release's own (`is_blackwell()` from
multimodal_gen's utils until 0.5.6.post2, `Platform.is_blackwell()` / `is_sm120()` from 0.5.7),
compiled against a stand-in `torch.cuda`; the backend modules it imports are stand-ins that
record `set_fa_ver` and say whether Sage Attention 3 is installed. Nothing imports torch.
"""

from __future__ import annotations

import ast
import builtins
import itertools
import logging
import types
from collections.abc import Callable, Mapping
from functools import cache
from typing import Any

import libcst as cst
import pytest
from packaging.version import Version

from sglpatch.patches.sm120_diffusion_fa_fallback import (
    FIXED,
    FUNCTION,
    TARGET,
    Sm120DiffusionFaFallback,
)
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DiffusionFaFallback()
PATH = "sglang/multimodal_gen/runtime/platforms/cuda.py"
INTERFACE = "sglang/multimodal_gen/runtime/platforms/interface.py"
UTILS = "sglang/multimodal_gen/runtime/utils/common.py"
# One release per shape: FA3 enum + raise on Blackwell; FA/FA4; `cls.` predicates + Sage 3.
BROKEN = ["0.5.5", "0.5.6.post2", "0.5.7"]
SDPA = "sdpa.SDPABackend"
REAL_IMPORT = builtins.__import__


class _Enum:
    """`AttentionBackendEnum`: a member is its own name (the choice compares them only)."""

    def __getattr__(self, name: str) -> str:
        return name


@cache
def _functions(source: bytes, names: frozenset[str], owner: str | None) -> list[ast.FunctionDef]:
    """Functions `names` at module level (owner None) or in class `owner`, decorators dropped
    (an `lru_cache` would carry one stand-in device's answer into the next)."""
    tree = ast.parse(source)
    body = tree.body
    if owner is not None:
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == owner).body
    found = [n for n in body if isinstance(n, ast.FunctionDef) and n.name in names]
    for node in found:
        node.decorator_list = []
    return found


def _compile(nodes: list[ast.FunctionDef], names: dict[str, Any]) -> dict[str, Any]:
    exec(compile(ast.Module(body=list(nodes), type_ignores=[]), "<stand-in>", "exec"), names)
    return names


def _platform(release: str, torch: Any, capability: tuple[int, int]) -> type:
    """The release's Platform predicates (0.5.7 on) on a CUDA platform of `capability`."""
    methods = _compile(
        _functions(
            wheels.member(release, INTERFACE), frozenset({"is_blackwell", "is_sm120"}), "Platform"
        ),
        {"torch": torch},
    )

    def has_device_capability(cls: type, wanted: int | tuple[int, int], device_id: int = 0) -> bool:
        return (
            capability >= wanted
            if isinstance(wanted, tuple)
            else (capability[0] * 10 + capability[1] >= wanted)
        )

    attributes: dict[str, Any] = {
        name: classmethod(methods[name]) for name in ("is_blackwell", "is_sm120") if name in methods
    }
    attributes.update(
        is_cuda_static=classmethod(lambda cls: True),
        has_device_capability=classmethod(has_device_capability),
        device_name="stand-in",
    )
    return type("StandInCudaPlatform", (), attributes)


@cache
def _chooser(source: bytes) -> ast.FunctionDef:
    (found,) = _functions(source, frozenset({FUNCTION}), "CudaPlatformBase")
    return found


def choose(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    selected: str | None,
    *,
    dtype: str = "bfloat16",
    head_size: int = 128,
    sage3: bool = False,
) -> tuple[str, tuple[int, ...]]:
    """(the backend class the release picks, the FlashAttention versions it set) or the error."""
    torch = types.SimpleNamespace(
        float16="float16",
        bfloat16="bfloat16",
        cuda=types.SimpleNamespace(get_device_capability=lambda device=None: capability),
    )
    names: dict[str, Any] = {"torch": torch}
    utils = _functions(wheels.member(release, UTILS), frozenset({"is_blackwell"}), None)
    if utils:  # 0.5.5-0.5.6.post2 import it at module level
        names["is_blackwell"] = _compile(utils, {**names, "is_cuda": lambda: True})["is_blackwell"]
    fa_versions: list[int] = []
    flash_attn = types.SimpleNamespace(
        set_fa_ver=fa_versions.append,
        FlashAttentionBackend=types.SimpleNamespace(get_supported_head_sizes=lambda: [64, 128]),
    )

    def stand_in_import(
        name: str,
        globals: Mapping[str, Any] | None = None,
        locals: Mapping[str, Any] | None = None,
        fromlist: tuple[str, ...] | None = (),
        level: int = 0,
    ) -> Any:
        if name.endswith(".backends.flash_attn"):
            return flash_attn
        if name.endswith(".backends.sage_attn3") and sage3:
            return types.SimpleNamespace(SageAttention3Backend=object)
        raise ImportError(f"stand-in: {name} is not installed")

    names.update(
        AttentionBackendEnum=_Enum(),
        logger=logging.getLogger("sglpatch.stand_in"),
        __builtins__={**vars(builtins), "__import__": stand_in_import},
    )
    function: Callable[..., str] = _compile([_chooser(source)], names)[FUNCTION]
    try:
        chosen = function(_platform(release, torch, capability), selected, head_size, dtype)
    except (ValueError, ImportError) as error:
        return f"{type(error).__name__}: {error}", tuple(fa_versions)
    return chosen.rsplit(".", 2)[-2] + "." + chosen.rsplit(".", 1)[-1], tuple(fa_versions)


def explicit_fa(release: str) -> str:
    """`--attention-backend fa`: `FA3` until 0.5.5.post2, `FA` from 0.5.5.post3."""
    return "FA3" if Version(release) < Version("0.5.5.post3") else "FA"


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_unpatched_release_sends_capability_12_to_sgl_kernel_fa3(
    release: str, capability: tuple[int, int]
) -> None:
    # FA3 (no set_fa_ver(4)): sgl-kernel's flash_attn_varlen_func, which serves capability 8/9.
    pristine = wheels.member(release, PATH)
    fa3 = ("flash_attn.FlashAttentionBackend", ())
    assert choose(pristine, release, capability, explicit_fa(release)) == fa3
    if release != "0.5.7":  # 0.5.7's default already tries Sage Attention 3, then SDPA
        assert choose(pristine, release, capability, None) == fa3


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_capability_12_chooses_what_0_5_8_chooses(
    release: str, capability: tuple[int, int]
) -> None:
    fixed = str(FIXED)
    upstream = wheels.member(fixed, PATH)
    assert choose(upstream, fixed, capability, None) == (SDPA, ())
    for ours, theirs in [(None, None), (explicit_fa(release), "FA"), ("TORCH_SDPA", "TORCH_SDPA")]:
        for dtype, head_size in [("bfloat16", 128), ("float32", 128), ("float16", 96)]:
            got = choose(
                wheels.patched(release, patch=PATCH),
                release,
                capability,
                ours,
                dtype=dtype,
                head_size=head_size,
            )
            want = choose(upstream, fixed, capability, theirs, dtype=dtype, head_size=head_size)
            assert got == want == (SDPA, ()), (ours, dtype, head_size)


def test_0_5_7_keeps_its_own_sage_attention_3_default_on_capability_12() -> None:
    # The one capability-12 choice the patch leaves alone: with Sage Attention 3 installed,
    # 0.5.7's default picks it (0.5.8 dropped that for SDPA); it is not the FA3 crash.
    for capability in stand_ins.SM120:
        pristine = choose(wheels.member("0.5.7", PATH), "0.5.7", capability, None, sage3=True)
        assert (
            choose(wheels.patched("0.5.7", patch=PATCH), "0.5.7", capability, None, sage3=True)
            == pristine
        )
        assert pristine == ("sage_attn3.SageAttention3Backend", ())


GRID = list(
    itertools.product(
        ["explicit", None, "TORCH_SDPA"], [("bfloat16", 128), ("float32", 64), ("float16", 96)]
    )
)


@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("release", BROKEN)
def test_other_capabilities_choose_exactly_what_they_chose(
    release: str, capability: tuple[int, int]
) -> None:
    pristine = wheels.member(release, PATH)
    for selected, (dtype, head_size) in GRID:
        backend = explicit_fa(release) if selected == "explicit" else selected
        for sage3 in (False, True):
            options = {"dtype": dtype, "head_size": head_size, "sage3": sage3}
            assert choose(
                wheels.patched(release, patch=PATCH), release, capability, backend, **options
            ) == choose(pristine, release, capability, backend, **options), (backend, options)


def test_b200_keeps_flashattention_4_and_hopper_fa3() -> None:
    for release in ["0.5.6.post2", "0.5.7"]:
        assert choose(wheels.patched(release, patch=PATCH), release, (10, 0), None) == (
            "flash_attn.FlashAttentionBackend",
            (4,),
        )
        assert choose(wheels.patched(release, patch=PATCH), release, (9, 0), None) == (
            "flash_attn.FlashAttentionBackend",
            (),
        )


@pytest.mark.parametrize("release", ["0.5.8", "0.5.12", "0.5.16", "0.5.23"])
def test_from_0_5_8_the_fallback_is_upstream_and_the_file_is_left_alone(release: str) -> None:
    wheels.assert_left_alone(PATCH, release)


def matrix_expected(release: Version) -> str:
    if TARGET.get(release) is None:
        return "not for this release"
    return "applied" if release < FIXED else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    name = str(release)
    chosen = choose(pristine[PATH], name, (12, 0), explicit_fa(name))
    assert chosen == ("flash_attn.FlashAttentionBackend", ()), chosen


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Capability 12 gets Torch SDPA for FlashAttention, as 0.5.8 gives it; other
    capabilities get what they got. From 0.5.8 the choice moves around: recognised in place."""
    name = str(release)
    if release >= FIXED:
        PATCH.postcondition(cst.parse_module(patched.get(PATH, wheels.member(name, PATH))), release)
        return
    source = patched[PATH]
    for capability in stand_ins.SM120:
        for selected in (None, explicit_fa(name)):
            chosen = choose(source, name, capability, selected)
            if chosen != (SDPA, ()):
                raise AssertionError(f"{release} at {capability}, {selected}: {chosen}")
    pristine = wheels.member(name, PATH)
    for capability in stand_ins.OTHERS:
        for selected in (None, explicit_fa(name)):
            assert choose(source, name, capability, selected) == choose(
                pristine, name, capability, selected
            )


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
