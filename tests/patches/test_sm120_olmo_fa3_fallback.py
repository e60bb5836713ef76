"""sm120-olmo-fa3-fallback on the real wheels: the release's own Olmo2 choice, run on stand-ins.

No release fixes it, so the proof is the kernel-support table: unpatched, capability 12 gets
`fa3`, whose own start-up assertion (compiled from the release) refuses 12; patched, it gets
`triton`, which runs there, and 8.9, 9.0 and 10.0 get exactly what they got before.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patch import Patch
from sglpatch.patches.sm120_olmo_fa3_fallback import OVERRIDE, Sm120OlmoFa3Fallback
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120OlmoFa3Fallback()
FIRST = "0.5.4"  # the release that added the Olmo2 override
# One release per .postN family: tests/test_matrix.py proves the effect on every release.
AFFECTED = [r for r in stand_ins.releases(FIRST, wheels.RELEASES[-1]) if ".post" not in r]
REGISTRY = "sglang/srt/layers/attention/attention_registry.py"
# What each capability got before the patch, on every affected release (read off the wheels).
BEFORE = {(8, 9): "fa3", (9, 0): "fa3", (10, 0): "trtllm_mha", (12, 0): "fa3", (12, 1): "fa3"}


class _Platform(stand_ins.StandInPlatform):
    """`get_platform()` with the two fields the overrides read besides the family flags."""

    def __init__(self, capability: tuple[int, int]) -> None:
        super().__init__(capability)
        self.is_cuda = True
        self.device_sm = capability[0] * 10 + capability[1]


def _names(release: str, capability: tuple[int, int]) -> dict[str, Any]:
    platform = _Platform(capability)
    return {
        **stand_ins.host_names(release, capability),
        "get_device_sm": lambda: capability[0] * 10 + capability[1],
        "get_platform": lambda: platform,
        "resolving_view": lambda args: args,
    }


def _fa3_from_ampere(node: ast.If) -> bool:
    """An if/elif chain with a `... >= 80` branch that sets "fa3"."""
    while True:
        sets_fa3 = any(
            isinstance(n, ast.Constant) and n.value == "fa3" for s in node.body for n in ast.walk(s)
        )
        from_ampere = any(
            isinstance(c, ast.Compare)
            and isinstance(c.ops[-1], ast.GtE)
            and isinstance(c.comparators[-1], ast.Constant)
            and c.comparators[-1].value == 80
            for c in ast.walk(node.test)
        )
        if sets_fa3 and from_ampere:
            return True
        if len(node.orelse) != 1 or not isinstance(node.orelse[0], ast.If):
            return False
        node = node.orelse[0]


@cache
def selection(source: bytes, function: str, architecture: str) -> ast.stmt:
    """`if <args>.attention_backend is None:` holding the architecture's fa3 chain."""
    tree = syntax.tree(source)
    scopes: list[ast.AST] = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == function
    ] or [
        n for n in ast.walk(tree) if isinstance(n, ast.If) and architecture in ast.unparse(n.test)
    ]
    guards = {
        id(n): n
        for scope in scopes
        for n in ast.walk(scope)
        if isinstance(n, ast.If)
        and ast.unparse(n.test).endswith("attention_backend is None")
        and any(isinstance(s, ast.If) and _fa3_from_ampere(s) for s in n.body)
    }
    (guard,) = guards.values()
    return guard


def choice(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    patch: Patch = PATCH,
    requested: str | None = None,
) -> str | None:
    """The attention backend the release's own override leaves for the architecture."""
    function, architecture = patch.function, patch.architecture  # type: ignore[attr-defined]
    args = types.SimpleNamespace(attention_backend=requested)
    overrides: dict[str, str] = {}  # 0.5.15+ return overrides instead of setting fields
    stand_ins.run_statement(
        selection(source, function, architecture),
        _names(release, capability),
        {"self": args, "server_args": args, "cfg": args, "overrides": overrides},
    )
    result = overrides.get("attention_backend", args.attention_backend)
    assert result is None or isinstance(result, str)
    return result


def fa3_starts(release: str, capability: tuple[int, int]) -> bool:
    """The release's own FA3 start-up assertion (`create_flashattention_v3_backend`)."""
    tree = syntax.tree(wheels.member(release, REGISTRY))
    (function,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "create_flashattention_v3_backend"
    ]
    # The CUDA one (from 0.5.14 a MUSA twin follows it).
    (check,) = [
        n
        for n in ast.walk(function)
        if isinstance(n, ast.Assert) and "requires SM>=80 and SM<=90" in ast.unparse(n)
    ]
    runner = types.SimpleNamespace(use_mla_backend=False)
    major, minor = capability
    test = compile(ast.Expression(check.test), REGISTRY, "eval")
    # Older releases ask torch directly, newer ones unpack get_device_capability() first.
    names = {"major": major, "minor": minor, "runner": runner}
    return bool(eval(test, {**names, "torch": stand_ins.stand_in_torch(capability)}))


def path(release: str, patch: Patch = PATCH) -> str:
    return f"sglang/{patch.target_file(Version(release))}"


@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_capability_12_gets_fa3_which_refuses_to_start_there(release: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.CAPABILITIES:
        assert choice(pristine, release, capability) == BEFORE[capability], capability
    for capability in stand_ins.SM120:
        assert not fa3_starts(release, capability)
        assert support.runs_on("attention", "fa3", capability) is False
    assert fa3_starts(release, (9, 0)) and fa3_starts(release, (8, 9))


@pytest.mark.parametrize("release", AFFECTED)
def test_patched_capability_12_gets_triton_which_runs_there(release: str) -> None:
    for capability in stand_ins.SM120:
        backend = choice(wheels.patched(release, patch=PATCH), release, capability)
        assert backend == "triton"
        assert support.runs_on("attention", backend, capability) is True
        # The release asserts Olmo2 never runs on FlashInfer: the fallback must not be it.
        assert backend != "flashinfer"


@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_choose_exactly_what_they_chose(release: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.OTHERS:
        assert choice(wheels.patched(release, patch=PATCH), release, capability) == choice(
            pristine, release, capability
        )


@pytest.mark.parametrize("requested", ["fa3", "flashinfer", "triton", "trtllm_mha"])
@pytest.mark.parametrize("release", ["0.5.9", "0.5.16", "0.5.23"])  # the three files
def test_a_backend_the_user_chose_is_kept(release: str, requested: str) -> None:
    for capability in stand_ins.SM120:
        assert (
            choice(wheels.patched(release, patch=PATCH), release, capability, requested=requested)
            == requested
        )


def test_before_0_5_4_there_is_no_olmo2_override() -> None:
    assert PATCH.target_file(Version("0.5.3.post3")) is None
    server_args = wheels.member("0.5.3.post3", "sglang/srt/server_args.py")
    assert b"Olmo2ForCausalLM" not in server_args


def test_the_files_follow_the_override() -> None:
    assert OVERRIDE.get(Version("0.5.14")) == "srt/server_args.py"
    for release in AFFECTED:
        source = wheels.member(release, path(release))
        selection(source, PATCH.function, PATCH.architecture)  # exactly one, or it raises


def matrix_expected(release: Version) -> str:
    return "not for this release" if release < Version(FIRST) else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 gets fa3, which the kernel-support table says cannot run there."""
    name = str(release)
    for capability in stand_ins.SM120:
        backend = choice(pristine[path(name)], name, capability)
        assert backend == "fa3" and not support.runs_on("attention", backend, capability)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    for capability in stand_ins.SM120:
        backend = choice(source, name, capability)
        assert backend == "triton" and support.runs_on("attention", backend, capability)
    pristine = wheels.member(name, path(name))
    for capability in stand_ins.OTHERS:
        assert choice(source, name, capability) == choice(pristine, name, capability)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
