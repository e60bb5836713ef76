"""Hybrid-GDN attention backends on capability 12: the patched old check admits what 0.5.16's
capability-12 list admits, and capability 10 keeps the release's own list."""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from functools import cache, partial
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_hybrid_gdn_backend import TARGET, Sm120HybridGdnBackend
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

PATCH = Sm120HybridGdnBackend()
PATH = "sglang/srt/layers/attention/attention_registry.py"
FIRST_FIX = "0.5.10"  # the first release whose check admits capability 12's default backend
SM120_LIST = "0.5.16"  # the first release with a list of its own for capability 12
BACKENDS = ["triton", "trtllm_mha", "flashinfer", "fa3", "fa4", "torch_native", "flex_attention"]
DEFAULT_METHOD = "_get_default_attn_backend"
RELEASES = ["0.5.4.post2", "0.5.5.post2", "0.5.9"]  # {triton}, then {triton, trtllm_mha}


@cache
def _check(source: bytes) -> ast.stmt:
    """`if is_blackwell(): ...` in attn_backend_wrapper's hybrid-GDN branch."""
    tree = syntax.tree(source)
    (wrapper,) = [
        n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "attn_backend_wrapper"
    ]
    (check,) = [
        n
        for n in ast.walk(wrapper)
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Call)
        and isinstance(n.test.func, ast.Name)
        and n.test.func.id == "is_blackwell"
    ]
    return check


def admitted(source: bytes, release: str, capability: tuple[int, int]) -> set[str]:
    """The backends the release's own hybrid-GDN check lets through on `capability`."""
    names = stand_ins.host_names(release, capability)
    through = set()
    for backend in BACKENDS:
        server_args = types.SimpleNamespace(
            attention_backend=backend, prefill_attention_backend=None, decode_attention_backend=None
        )
        # 0.5.18 reads the resolved backends off the runner instead.
        runner = types.SimpleNamespace(
            server_args=server_args,
            prefill_attention_backend_str=backend,
            decode_attention_backend_str=backend,
        )
        try:
            stand_ins.run_statement(_check(source), names, {"runner": runner})
        except AssertionError:
            continue
        through.add(backend)
    return through


def default_backend(release: str, capability: tuple[int, int]) -> str:
    """The attention backend the release's ServerArgs picks when none is given (MHA model)."""
    tree = syntax.tree(wheels.member(release, "sglang/srt/server_args.py"))
    (method,) = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.FunctionDef) and n.name == "_handle_attention_backend_compatibility"
    ]
    (choose,) = [
        n
        for n in method.body
        if isinstance(n, ast.If)
        and isinstance(n.test, ast.Compare)
        and isinstance(n.test.left, ast.Attribute)
        and n.test.left.attr == "attention_backend"
        and isinstance(n.test.ops[0], ast.Is)
    ]
    args = types.SimpleNamespace(attention_backend=None, speculative_algorithm=None)
    names: dict[str, object] = {
        **stand_ins.host_names(release, capability),
        "is_no_spec_infer_or_topk_one": lambda server_args: True,
        "is_flashinfer_available": lambda: True,  # the wheels require flashinfer_python
        "is_fa3_default_architecture": lambda hf_config: True,
    }
    # From 0.5.10 the choice is its own method; bind the release's own to the stand-in `self`.
    helpers = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == DEFAULT_METHOD
    ]
    if helpers:
        namespace = dict(names)
        module = ast.Module(body=[helpers[0]], type_ignores=[])
        exec(compile(module, "server_args.py", "exec"), namespace)
        setattr(args, DEFAULT_METHOD, partial(namespace[DEFAULT_METHOD], args))
    local = {"self": args, "model_config": mock.MagicMock(), "use_mla_backend": False}
    stand_ins.run_statement(choose, names, local)
    assert isinstance(args.attention_backend, str)
    return args.attention_backend


def matrix_expected(release: Version) -> str:
    if TARGET.get(release) is None:
        return "not for this release"
    return "applied" if release < Version(FIRST_FIX) else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12's default backend (flashinfer) fails the Blackwell assert."""
    for capability in stand_ins.SM120:
        assert "flashinfer" not in admitted(pristine[PATH], str(release), capability)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    for capability in stand_ins.SM120:
        through = admitted(patched[PATH], name, capability)
        assert "flashinfer" in through
        if release < Version(FIRST_FIX):
            upstream = wheels.member(SM120_LIST, PATH)
            assert through == admitted(upstream, SM120_LIST, capability)
    if release < Version(FIRST_FIX):
        pristine = wheels.member(name, PATH)
        for capability in stand_ins.OTHERS:
            assert admitted(patched[PATH], name, capability) == admitted(pristine, name, capability)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_admits_what_0_5_16_admits(release: str, capability: tuple[int, int]) -> None:
    ours = admitted(wheels.patched(release, patch=PATCH), release, capability)
    assert ours == admitted(wheels.member(SM120_LIST, PATH), SM120_LIST, capability)
    assert ours == {"triton", "trtllm_mha", "flashinfer"}


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_against_the_first_fix_only_fa4_differs(capability: tuple[int, int]) -> None:
    """0.5.10 let every Blackwell part through with fa4 too; 0.5.16 took it back on 12."""
    first_fix = admitted(wheels.member(FIRST_FIX, PATH), FIRST_FIX, capability)
    assert first_fix - admitted(wheels.patched(SEED, patch=PATCH), SEED, capability) == {"fa4"}
    assert admitted(wheels.patched(SEED, patch=PATCH), SEED, capability) <= first_fix


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_default_backend_passes_only_when_patched(
    release: str, capability: tuple[int, int]
) -> None:
    default = default_backend(release, capability)
    assert default == "flashinfer" == default_backend(FIRST_FIX, capability)
    assert default not in admitted(wheels.member(release, PATH), release, capability)  # the bug
    assert default in admitted(wheels.patched(release, patch=PATCH), release, capability)
    assert default in admitted(wheels.member(FIRST_FIX, PATH), FIRST_FIX, capability)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
def test_other_capabilities_admit_what_they_admitted(
    release: str, capability: tuple[int, int]
) -> None:
    pristine = wheels.member(release, PATH)
    assert admitted(wheels.patched(release, patch=PATCH), release, capability) == admitted(
        pristine, release, capability
    )


def test_capability_10_keeps_its_own_list() -> None:
    assert admitted(wheels.patched(SEED, patch=PATCH), SEED, (10, 0)) == {
        "triton",
        "trtllm_mha",
    }
    assert admitted(wheels.patched("0.5.4.post2", patch=PATCH), "0.5.4.post2", (10, 0)) == {
        "triton"
    }


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
