"""sm120-default-mha-trtllm-gate on the real wheels: the release's own default choice, run on stand-ins.

Unpatched 0.5.6.post1/post2 give capability 12 `trtllm_mha` for an MHA model with default flags,
and the same release's own trtllm_mha check (compiled from it) then refuses to start there.
Patched, 12 gets what 0.5.7's own chain gives it under the same stand-in; 8.9, 9.0 and 10.0
get exactly what they got before. From 0.5.7 on every release's chain is run as it ships.
"""

from __future__ import annotations

import ast
import contextlib
import sys
import types
from collections.abc import Mapping
from functools import cache
from typing import Any
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_default_mha_trtllm_gate import TARGET, Sm120DefaultMhaTrtllmGate
from sglpatch.results import AlreadyApplied
from tests.support import stand_ins_moe as stand_ins
from tests.support import wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120DefaultMhaTrtllmGate()
FIRST, FIXED = "0.5.6.post1", "0.5.7"
AFFECTED = ["0.5.6.post1", "0.5.6.post2"]
UPSTREAM = stand_ins.releases(FIXED, wheels.RELEASES[-1])
COMMON = "sglang/srt/utils/common.py"
# An MHA model in the release's fa3-on-Hopper list, and one outside it.
MODELS = ["LlamaForCausalLM", "MistralForCausalLM"]
REFUSAL = "only supported on Blackwell GPUs (SM100)"


class _Platform(stand_ins.StandInPlatform):
    """`get_platform()` with the fields the default choice of 0.5.19+ reads."""

    def __init__(self, capability: tuple[int, int]) -> None:
        super().__init__(capability)
        self.is_cuda = True
        self.is_hopper_with_cuda_12_3 = capability[0] == 9
        self.has_flashinfer = True


def path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


@cache
def _common_functions(release: str) -> dict[str, Any]:
    """The release's own `is_no_spec_infer_or_topk_one` and `is_fa3_default_architecture`."""
    source = wheels.member(release, COMMON)
    found = {}
    for name in ("is_no_spec_infer_or_topk_one", "is_fa3_default_architecture"):
        with contextlib.suppress(LookupError):  # is_fa3_default_architecture left later
            found[name] = stand_ins.load_function(source, name, {})
    return found


def _names(release: str, capability: tuple[int, int], flashinfer: bool) -> dict[str, Any]:
    platform = _Platform(capability)
    platform.has_flashinfer = flashinfer
    return {
        **stand_ins.host_names(release, capability),
        **_common_functions(release),
        "is_flashinfer_available": lambda: flashinfer,
        "get_platform": lambda: platform,
        "resolving_view": lambda args: args,
        "resolved_view": lambda args: args,
    }


@cache
def mha_choice(source: bytes) -> ast.If:
    """`if not use_mla_backend:`, the release's default choice for MHA (and MLA) models."""
    found = stand_ins.find_statement(
        source,
        lambda n: isinstance(n, ast.If) and ast.unparse(n.test) == "not use_mla_backend",
        "default attention choice",
    )
    assert isinstance(found, ast.If)
    return found


def _run(statement: ast.stmt, names: Mapping[str, Any], local_names: Mapping[str, Any]) -> Any:
    """Run one statement as a function body; what it returns (0.5.13+ return the choice)."""
    function = ast.FunctionDef(
        name="_choice",
        args=ast.arguments(
            posonlyargs=[],
            args=[ast.arg(a) for a in local_names],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        body=[statement, ast.Return(ast.Constant(None))],
        decorator_list=[],
        returns=None,
        type_comment=None,
    )
    if sys.version_info >= (3, 12):
        function.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[function], type_ignores=[]))
    namespace: dict[str, Any] = dict(names)
    exec(compile(module, "<default-attention>", "exec"), namespace)
    with mock.patch.dict(sys.modules, _imported_modules(statement, names)):
        return namespace["_choice"](*local_names.values())


def _imported_modules(statement: ast.stmt, names: Mapping[str, Any]) -> dict[str, Any]:
    """Modules for the statement's own `from X import y` (0.5.14-0.5.18 import resolved_view
    inside the choice), serving `y` from `names`; a name not there is not served."""
    modules: dict[str, Any] = {}
    for node in ast.walk(statement):
        if isinstance(node, ast.ImportFrom) and node.module:
            parts = node.module.split(".")
            for i in range(1, len(parts) + 1):
                modules.setdefault(".".join(parts[:i]), types.ModuleType(".".join(parts[:i])))
            for alias in node.names:
                if alias.name in names:
                    setattr(modules[node.module], alias.name, names[alias.name])
    return modules


def server_args(architecture: str, **given: Any) -> types.SimpleNamespace:
    """Default flags for a one-GPU start-up of `architecture`."""
    model_config = types.SimpleNamespace(
        hf_config=types.SimpleNamespace(architectures=[architecture]),
        has_attention_sinks=False,
        has_asymmetric_kv=False,
    )
    fields: dict[str, Any] = {
        "attention_backend": None,
        "prefill_attention_backend": None,
        "decode_attention_backend": None,
        "speculative_algorithm": None,
        "speculative_eagle_topk": None,
        "page_size": None,
        "tp_size": 1,
        "model_config": model_config,
        **given,
    }
    return types.SimpleNamespace(**fields)


def default_backend(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    architecture: str = "MistralForCausalLM",
    flashinfer: bool = True,
) -> str:
    """What the release's own default choice gives an MHA model with default flags."""
    args = server_args(architecture)
    returned = _run(
        mha_choice(source),
        _names(release, capability, flashinfer),
        {
            "self": args,
            "server_args": args,
            "cfg": args,
            "model_config": args.model_config,
            "use_mla_backend": False,
        },
    )
    backend = returned if returned is not None else args.attention_backend
    assert isinstance(backend, str)
    return backend


def trtllm_mha_starts(release: str, capability: tuple[int, int]) -> bool:
    """The release's own trtllm_mha check (`if self.attention_backend == "trtllm_mha" or ...`)."""
    source = wheels.member(release, "sglang/srt/server_args.py")
    check = stand_ins.find_statement(
        source,
        lambda n: (
            isinstance(n, ast.If)
            and ast.unparse(n.test).startswith("self.attention_backend == 'trtllm_mha' or")
            and REFUSAL in ast.unparse(n)
        ),
        "trtllm_mha check",
    )
    args = server_args("MistralForCausalLM", attention_backend="trtllm_mha", page_size=64)
    try:
        _run(check, _names(release, capability, True), {"self": args})
    except ValueError as error:
        assert REFUSAL in str(error)
        return False
    return True


@pytest.mark.parametrize("architecture", MODELS)
@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_capability_12_gets_trtllm_mha_which_the_release_refuses(
    release: str, architecture: str
) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.SM120:
        assert default_backend(pristine, release, capability, architecture) == "trtllm_mha"
        assert not trtllm_mha_starts(release, capability)
        assert support.runs_on("attention", "trtllm_mha", capability, release=release) is False
    assert default_backend(pristine, release, (10, 0), architecture) == "trtllm_mha"
    assert trtllm_mha_starts(release, (10, 0))


@pytest.mark.parametrize("flashinfer", [True, False])
@pytest.mark.parametrize("architecture", MODELS)
@pytest.mark.parametrize("release", AFFECTED)
def test_patched_capability_12_gets_what_0_5_7_gives_it(
    release: str, architecture: str, flashinfer: bool
) -> None:
    fixed = wheels.member(FIXED, path(FIXED))
    for capability in stand_ins.SM120:
        backend = default_backend(
            wheels.patched(release, patch=PATCH), release, capability, architecture, flashinfer
        )
        upstream = default_backend(fixed, FIXED, capability, architecture, flashinfer)
        assert backend == upstream == ("flashinfer" if flashinfer else "triton")
        assert support.runs_on("attention", backend, capability, release=release) is True


@pytest.mark.parametrize("architecture", MODELS)
@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_choose_exactly_what_they_chose(release: str, architecture: str) -> None:
    pristine = wheels.member(release, path(release))
    chosen = {
        capability: default_backend(
            wheels.patched(release, patch=PATCH), release, capability, architecture
        )
        for capability in stand_ins.OTHERS
    }
    assert chosen == {
        capability: default_backend(pristine, release, capability, architecture)
        for capability in stand_ins.OTHERS
    }
    assert chosen[(10, 0)] == "trtllm_mha"
    assert chosen[(9, 0)] == ("fa3" if architecture == "LlamaForCausalLM" else "flashinfer")


@pytest.mark.parametrize("release", UPSTREAM)
def test_from_0_5_7_the_file_is_left_alone_and_12_gets_no_trtllm_mha(release: str) -> None:
    name = path(release)
    source = wheels.member(release, name)
    change, outcomes = engine.transform_source(source, name, [PATCH], Version(release))
    assert change is None
    outcome = outcomes[PATCH.id]
    assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream"
    for capability in stand_ins.SM120:
        assert default_backend(source, release, capability) != "trtllm_mha"
    assert default_backend(source, release, (10, 0)) == "trtllm_mha"


def test_before_0_5_6_post1_the_default_has_no_trtllm_mha() -> None:
    assert PATCH.target_file(Version("0.5.6")) is None
    source = wheels.member("0.5.6", "sglang/srt/server_args.py")
    for capability in stand_ins.CAPABILITIES:
        assert default_backend(source, "0.5.6", capability) != "trtllm_mha"


def matrix_expected(release: Version) -> str:
    if release < Version(FIRST):
        return "not for this release"
    return "already upstream" if release >= Version(FIXED) else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12 gets trtllm_mha, which the release's own check refuses there."""
    name = str(release)
    for capability in stand_ins.SM120:
        assert default_backend(pristine[path(name)], name, capability) == "trtllm_mha"
        assert not trtllm_mha_starts(name, capability)


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    for capability in stand_ins.SM120:
        backend = default_backend(source, name, capability)
        assert backend != "trtllm_mha" and support.runs_on("attention", backend, capability)
    pristine = wheels.member(name, path(name))
    for capability in stand_ins.OTHERS:
        assert default_backend(source, name, capability) == default_backend(
            pristine, name, capability
        )


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
