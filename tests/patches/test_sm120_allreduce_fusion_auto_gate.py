"""sm120-allreduce-fusion-auto-gate on the real wheels: the release's own auto-enable, run.

Each `self.enable_flashinfer_allreduce_fusion = True` of the release's
`_handle_model_specific_adjustments` is reached when every `if` on the way to it holds (and
every earlier branch of an `elif` chain on the way does not): those conditions are cut out of
the release and evaluated with its own capability predicates on stand-in GPUs, for a one-node
TP 2 start-up of each model. Unpatched, 0.5.4.post2 - 0.5.7 turn the fusion on at 12.0 and
12.1 (GPT-OSS; on 0.5.7 DeepSeek-V3, GLM-4.5 and Qwen3-MoE too), where FlashInfer's TRT-LLM
fusion kernels do not build; patched, 12 decides as 0.5.8's own gate decides, and 8.9, 9.0 and
10.0 exactly as before.
"""

from __future__ import annotations

import ast
import types
from collections.abc import Iterator, Mapping
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_allreduce_fusion_auto_gate import (
    ARCHITECTURES,
    TARGET,
    Sm120AllreduceFusionAutoGate,
)
from sglpatch.results import AlreadyApplied
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120AllreduceFusionAutoGate()
FIRST, FIXED, LAST = "0.5.4.post2", "0.5.8", "0.5.13.post1"
AFFECTED = stand_ins.releases(FIRST, "0.5.7")
UPSTREAM = stand_ins.releases(FIXED, LAST)
SHAPES = ["0.5.4.post2", "0.5.6.post2", "0.5.7"]  # GPT-OSS's own branch (two spellings), 0.5.7's
FLAG = "enable_flashinfer_allreduce_fusion"
METHOD = "_handle_model_specific_adjustments"
COMM = ("comm", "flashinfer_allreduce_fusion")

Condition = tuple[ast.expr, bool]


def path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


def _enables(node: ast.stmt) -> bool:
    return (
        isinstance(node, ast.Assign)
        and isinstance(node.value, ast.Constant)
        and node.value.value is True
        and any(
            isinstance(t, ast.Attribute)
            and isinstance(t.value, ast.Name)
            and t.value.id == "self"
            and t.attr == FLAG
            for t in node.targets
        )
    )


def _paths(body: list[ast.stmt], taken: tuple[Condition, ...]) -> Iterator[tuple[Condition, ...]]:
    """The conditions on the way to each statement of `body` (at any depth) that turns it on."""
    for node in body:
        if _enables(node):
            yield taken
        elif isinstance(node, ast.If):
            yield from _paths(node.body, (*taken, (node.test, True)))
            yield from _paths(node.orelse, (*taken, (node.test, False)))
        elif isinstance(node, (ast.With, ast.Try)):
            yield from _paths(node.body, taken)
        else:  # a loop would need more than its condition: none is on the way
            assert not any(_enables(n) for n in ast.walk(node) if isinstance(n, ast.stmt)), node


@cache
def sites(source: bytes) -> tuple[tuple[Condition, ...], ...]:
    (server_args,) = [
        n
        for n in syntax.tree(source).body
        if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    ]
    (method,) = [n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == METHOD]
    found = tuple(_paths(method.body, ()))
    assert found, "the release never turns the fusion on"
    return found


def start_up(**given: Any) -> types.SimpleNamespace:
    """A one-node TP 2 start-up with default flags (fusion not asked for)."""
    fields: dict[str, Any] = {
        FLAG: False,
        "tp_size": 2,
        "nnodes": 1,
        "enable_dp_attention": False,
        "attn_cp_size": 1,  # 0.5.10+
        "moe_a2a_backend": "none",
        **given,
    }
    return types.SimpleNamespace(**fields)


def auto_enabled(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    architecture: str,
    **given: Any,
) -> bool:
    """Whether the release's own conditions turn the fusion on for `architecture`."""
    names = {
        **stand_ins.host_names(release, capability),
        "self": start_up(**given),
        "model_arch": architecture,
        "hf_config": types.SimpleNamespace(architectures=[architecture]),
        "is_deepseek_nsa": lambda config: False,
        "is_h20_device": False,  # 0.5.7+: computed from get_device_name() just before
    }
    for conditions in sites(source):
        if all(
            bool(eval(compile(ast.Expression(test), "<gate>", "eval"), dict(names))) == wanted
            for test, wanted in conditions
        ):
            return True
    return False


def _unpatched_sm120(release: str) -> set[str]:
    """The models whose fusion unpatched `release` turns on at capability 12 (read off the wheels)."""
    return set(ARCHITECTURES) if release == "0.5.7" else {"GptOssForCausalLM"}


@pytest.mark.parametrize("release", SHAPES)
def test_unpatched_capability_12_turns_on_a_fusion_that_does_not_build_there(
    release: str,
) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.SM120:
        chosen = {a for a in ARCHITECTURES if auto_enabled(pristine, release, capability, a)}
        assert chosen == _unpatched_sm120(release)
        assert support.runs_on(*COMM, capability, release=release) is False
    assert auto_enabled(pristine, release, (10, 0), "GptOssForCausalLM")
    assert support.runs_on(*COMM, (10, 0), release=release) is True


@pytest.mark.parametrize("architecture", ARCHITECTURES)
@pytest.mark.parametrize("release", SHAPES)
def test_patched_capability_12_decides_what_0_5_8_decides(release: str, architecture: str) -> None:
    fixed = wheels.member(FIXED, path(FIXED))
    for capability in stand_ins.SM120:
        decided = auto_enabled(
            wheels.patched(release, patch=PATCH), release, capability, architecture
        )
        assert decided == auto_enabled(fixed, FIXED, capability, architecture) is False


@pytest.mark.parametrize(
    "given",
    [{}, {"enable_dp_attention": True}, {"nnodes": 2}, {"moe_a2a_backend": "deepep"}],
    ids=["tp2", "dp-attention", "two-nodes", "deepep"],
)
@pytest.mark.parametrize("release", SHAPES)
def test_other_capabilities_decide_exactly_as_before(release: str, given: dict[str, Any]) -> None:
    pristine = wheels.member(release, path(release))
    decided = {
        (capability, a): auto_enabled(
            wheels.patched(release, patch=PATCH), release, capability, a, **given
        )
        for capability in stand_ins.OTHERS
        for a in ARCHITECTURES
    }
    assert decided == {
        (capability, a): auto_enabled(pristine, release, capability, a, **given)
        for capability in stand_ins.OTHERS
        for a in ARCHITECTURES
    }
    if not given:  # the fusion stays on where it builds
        assert decided[((10, 0), "GptOssForCausalLM")]
        assert decided[((9, 0), "GptOssForCausalLM")] == (release == "0.5.7")


@pytest.mark.parametrize("release", UPSTREAM)
def test_from_0_5_8_the_gate_is_upstream_and_12_never_turns_it_on(release: str) -> None:
    name = path(release)
    source = wheels.member(release, name)
    change, outcomes = engine.transform_source(source, name, [PATCH], Version(release))
    assert change is None
    outcome = outcomes[PATCH.id]
    assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream"
    for capability in stand_ins.SM120:
        assert not any(auto_enabled(source, release, capability, a) for a in ARCHITECTURES)
    assert auto_enabled(source, release, (10, 0), "GptOssForCausalLM")


def test_before_0_5_4_post2_and_from_0_5_14_there_is_nothing_to_patch() -> None:
    source = wheels.member("0.5.4.post1", "sglang/srt/server_args.py")
    for capability in stand_ins.SM120:
        assert not any(auto_enabled(source, "0.5.4.post1", capability, a) for a in ARCHITECTURES)
    for release in ("0.5.4.post1", "0.5.14", "0.5.23"):
        assert PATCH.target_file(Version(release)) is None
    # 0.5.14 replaced the flag: nothing sets it any more, --flashinfer-allreduce-fusion-backend
    # is what is auto-enabled (under is_sm90_supported() or is_sm100_supported()).
    text = wheels.member("0.5.14", "sglang/srt/server_args.py").decode()
    assert f"self.{FLAG} = True" not in text
    assert "(is_sm90_supported() or is_sm100_supported())" in text


def matrix_expected(release: Version) -> str:
    if TARGET.get(release) is None:
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12 turns on GPT-OSS's fusion (0.5.7: every model of its list)."""
    name = str(release)
    for capability in stand_ins.SM120:
        chosen = {
            a for a in ARCHITECTURES if auto_enabled(pristine[path(name)], name, capability, a)
        }
        assert chosen == _unpatched_sm120(name)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    pristine = wheels.member(name, path(name))
    for a in ARCHITECTURES:
        for capability in stand_ins.SM120:
            assert not auto_enabled(source, name, capability, a)
        for capability in stand_ins.OTHERS:
            assert auto_enabled(source, name, capability, a) == auto_enabled(
                pristine, name, capability, a
            )
    assert auto_enabled(source, name, (10, 0), "GptOssForCausalLM")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
