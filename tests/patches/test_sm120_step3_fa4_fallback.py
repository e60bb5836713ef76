"""sm120-step3-fa4-fallback on the real wheels: the release's Step3p choice, then its default.

Unpatched, 0.5.13-0.5.17 give capability 12 `fa4`, which the kernel-support table does not let
run there (flash-attn-4 and the vendored copies assert "Paged KV not supported on SM 12.0");
patched, the Step3p override leaves 12 to the release's own default choice (run from the same
wheel: FlashInfer, Triton without it), and 8.9, 9.0 and 10.0 get what they got before. From
0.5.18, where fa4 runs on 12, the file is left alone.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_step3_fa4_fallback import (
    FA4_ON_SM120,
    OVERRIDE,
    Sm120Step3Fa4Fallback,
)
from sglpatch.results import AlreadyApplied
from tests.patches import test_sm120_default_mha_trtllm_gate as defaults
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120Step3Fa4Fallback()
FIRST = "0.5.13"  # the release that added the Step3p attention choice
AFFECTED = stand_ins.releases(FIRST, "0.5.17")
UPSTREAM = stand_ins.releases(str(FA4_ON_SM120), wheels.RELEASES[-1])
ARCHITECTURES = ["Step3p5ForCausalLM", "Step3p7ForConditionalGeneration"]
# What each capability gets unpatched on every release from 0.5.13 (read off the wheels).
BEFORE = {(8, 9): "flashinfer", (9, 0): "fa3", (10, 0): "fa4", (12, 0): "fa4", (12, 1): "fa4"}
# SGLang's vendored FlashAttention-4 interface, where a release ships one.
VENDORED = {
    "0.5.16": "sglang/jit_kernel/flash_attn/cute/interface.py",
    "0.5.17": "sglang/kernels/ops/attention/flash_attn/cute/interface.py",
}


def path(release: str) -> str:
    target = OVERRIDE.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


@cache
def selection(source: bytes) -> ast.stmt:
    """`if ...is_attention_backend_not_set(...):` of the Step3p override."""
    tree = syntax.tree(source)
    scopes: list[ast.AST] = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "_step3p_overrides"
    ] or [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and "Step3p5ForCausalLM" in ast.unparse(n.test)
    ]
    guards = {
        id(n): n
        for scope in scopes
        for n in ast.walk(scope)
        if isinstance(n, ast.If)
        and "is_attention_backend_not_set" in ast.unparse(n.test)
        and "'fa4'" in ast.unparse(n)
    }
    (guard,) = guards.values()
    return guard


@cache
def _not_set(release: str) -> Any:
    """The release's own `is_attention_backend_not_set` (a ServerArgs method, or from 0.5.19 a
    function of model_override_base.py), compiled alone."""
    for name in ("sglang/srt/arg_groups/model_override_base.py", "sglang/srt/server_args.py"):
        if name not in wheels.members(release):
            continue
        tree = syntax.tree(wheels.member(release, name))
        found = [
            n
            for n in ast.walk(tree)
            if isinstance(n, ast.FunctionDef) and n.name == "is_attention_backend_not_set"
        ]
        if found:
            namespace: dict[str, Any] = {"Any": Any}
            module = ast.Module(body=[found[0]], type_ignores=[])
            exec(compile(module, name, "exec"), namespace)
            return namespace["is_attention_backend_not_set"]
    raise LookupError(f"no is_attention_backend_not_set in {release}")


def choice(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    architecture: str = "Step3p5ForCausalLM",
    flashinfer: bool = True,
    requested: str | None = None,
) -> str:
    """The attention backend a Step3p start-up ends with: the override's, else the default."""
    not_set = _not_set(release)
    args = defaults.server_args(architecture, attention_backend=requested)
    args.is_attention_backend_not_set = lambda: not_set(args)
    overrides: dict[str, Any] = {}  # 0.5.15+ return overrides instead of setting fields
    names = {
        **stand_ins.host_names(release, capability),
        "get_platform": lambda: defaults._Platform(capability),
        "resolving_view": lambda view: view,
        "is_attention_backend_not_set": not_set,
    }
    stand_ins.run_statement(
        selection(source),
        names,
        {"self": args, "server_args": args, "cfg": args, "overrides": overrides},
    )
    backend = overrides.get("attention_backend", args.attention_backend)
    if backend is None:
        default = wheels.member(release, defaults.path(release))
        backend = defaults.default_backend(default, release, capability, architecture, flashinfer)
    assert isinstance(backend, str)
    return backend


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_capability_12_gets_fa4_which_does_not_run_there(
    release: str, architecture: str
) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.CAPABILITIES:
        assert choice(pristine, release, capability, architecture) == BEFORE[capability]
    for capability in stand_ins.SM120:
        # False from 0.5.16; 0.5.13-0.5.15 read "unknown" until the table has their reading.
        assert support.runs_on("attention", "fa4", capability, release=release) is not True


@pytest.mark.parametrize("release", sorted(VENDORED))
def test_the_vendored_fa4_asserts_paged_kv_on_sm_12(release: str) -> None:
    tree = syntax.tree(wheels.member(release, VENDORED[release]))
    branches = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If) and ast.unparse(n.test) == "arch // 10 == 12"
    ]
    asserts = [
        ast.unparse(a)
        for b in branches
        for s in b.body
        for a in ast.walk(s)
        if isinstance(a, ast.Assert)
    ]
    assert any(
        "page_table is None" in a and "Paged KV not supported on SM 12.0" in a for a in asserts
    )


@pytest.mark.parametrize("flashinfer", [True, False])
@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("release", AFFECTED)
def test_patched_capability_12_gets_the_release_default_which_runs_there(
    release: str, architecture: str, flashinfer: bool
) -> None:
    for capability in stand_ins.SM120:
        backend = choice(
            wheels.patched(release, patch=PATCH), release, capability, architecture, flashinfer
        )
        assert backend == ("flashinfer" if flashinfer else "triton")
        assert support.runs_on("attention", backend, capability, release=release) is True


@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_choose_exactly_what_they_chose(release: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.OTHERS:
        assert choice(wheels.patched(release, patch=PATCH), release, capability) == choice(
            pristine, release, capability
        )


@pytest.mark.parametrize("requested", ["fa3", "fa4", "flashinfer", "triton"])
@pytest.mark.parametrize("release", ["0.5.13", "0.5.17"])  # the two files
def test_a_backend_the_user_chose_is_kept(release: str, requested: str) -> None:
    for capability in stand_ins.SM120:
        assert (
            choice(wheels.patched(release, patch=PATCH), release, capability, requested=requested)
            == requested
        )


@pytest.mark.parametrize("release", UPSTREAM)
def test_from_0_5_18_fa4_runs_on_12_and_the_file_is_left_alone(release: str) -> None:
    name = path(release)
    source = wheels.member(release, name)
    change, outcomes = engine.transform_source(source, name, [PATCH], Version(release))
    assert change is None
    outcome = outcomes[PATCH.id]
    assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream"
    for capability in stand_ins.SM120:
        assert choice(source, release, capability) == "fa4"
        assert support.runs_on("attention", "fa4", capability, release=release) is True


def test_0_5_18_takes_capability_12_to_its_own_fa4_port() -> None:
    backend = wheels.member("0.5.18", "sglang/srt/layers/attention/flashattention_backend.py")
    assert b"device_capability[0] == 12" in backend
    assert b"flash_attention_v4_sm120 import" in backend
    assert "sglang/kernels/ops/attention/flash_attention_v4_sm120.py" in wheels.members("0.5.18")


def test_before_0_5_13_step3p_has_no_attention_choice() -> None:
    assert PATCH.target_file(Version("0.5.12.post1")) is None
    source = wheels.member("0.5.12.post1", "sglang/srt/server_args.py")
    assert b"Step3p5ForCausalLM" in source and b"fa4 attention backend for Step3p7" not in source


def matrix_expected(release: Version) -> str:
    if release < Version(FIRST):
        return "not for this release"
    return "already upstream" if release >= FA4_ON_SM120 else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12 gets fa4, which the kernel-support table does not let run there."""
    name = str(release)
    for capability in stand_ins.SM120:
        assert choice(pristine[path(name)], name, capability) == "fa4"
        assert support.runs_on("attention", "fa4", capability, release=name) is not True


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    for capability in stand_ins.SM120:
        backend = choice(source, name, capability)
        assert support.runs_on("attention", backend, capability, release=name) is True
    pristine = wheels.member(name, path(name))
    for capability in stand_ins.OTHERS:
        assert choice(source, name, capability) == choice(pristine, name, capability)


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
