"""sm120-allreduce-fusion-refusal on the real wheels: what the explicit flag leads to, run.

Unpatched, a user's `--enable-flashinfer-allreduce-fusion` at TP 2 makes the release's own
`LayerCommunicator.should_fuse_mlp_allreduce_with_next_layer` (cut out of its communicator.py and
run on stand-in GPUs) choose the fused FlashInfer all-reduce at 12.0 and 12.1, a kernel that
does not build there (the kernel-support table, from FlashInfer's own arch list); 0.5.8's
answers no there (upstream ignores the flag on 12). Patched, the release's `__post_init__` runs
the inserted refusal before the model-specific adjustments: a ValueError naming the flag at
12.0/12.1 with TP > 1, and nothing at TP 1, without the flag, or on 8.9, 9.0 and 10.0.
"""

from __future__ import annotations

import ast
import copy
import types
from collections.abc import Mapping
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_allreduce_fusion_refusal import (
    ADJUSTMENTS,
    FLAG,
    MESSAGE,
    TARGET,
    Sm120AllreduceFusionRefusal,
)
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120AllreduceFusionRefusal()
FIXED = "0.5.8"
AFFECTED = stand_ins.releases("0.5.3", "0.5.7")
# The communicator's shapes: global_server_args_dict; SpeculativeAlgorithm.from_string(...);
# get_global_server_args(); get_attn_tp_context().
SHAPES = ["0.5.3", "0.5.3.post2", "0.5.5", "0.5.7"]
COMMUNICATOR = "sglang/srt/layers/communicator.py"
SERVER_ARGS = "sglang/srt/server_args.py"
COMMON = "sglang/srt/utils/common.py"
COMM = ("comm", "flashinfer_allreduce_fusion")


def _names(release: str, capability: tuple[int, int]) -> dict[str, Any]:
    names = stand_ins.host_names(release, capability)
    torch = stand_ins.stand_in_torch(capability)
    sm = stand_ins.load_function(wheels.member(release, COMMON), "get_device_sm", {"torch": torch})
    return {**names, "get_device_sm": sm}


def _server_args(asked: bool, tp_size: int) -> types.SimpleNamespace:
    return types.SimpleNamespace(
        **{FLAG: asked, "tp_size": tp_size, "enable_dp_attention": False},
        speculative_algorithm=None,
    )


# --- unpatched: where the flag leads ------------------------------------------------------------


def _method(source: bytes) -> ast.FunctionDef:
    (found,) = [
        n
        for n in ast.walk(syntax.tree(source))
        if isinstance(n, ast.FunctionDef) and n.name == "should_fuse_mlp_allreduce_with_next_layer"
    ]
    bare = copy.deepcopy(found)  # the shared tree is only read; its copy loses annotations
    bare.returns = None
    for argument in bare.args.args:
        argument.annotation = None
    return bare


def fuses(release: str, capability: tuple[int, int], asked: bool = True, tp_size: int = 2) -> bool:
    """Whether the release's own communicator fuses a mid-model MLP all-reduce (batch of 8)."""
    source = wheels.member(release, COMMUNICATOR)
    args = _server_args(asked, tp_size)
    names: dict[str, Any] = {
        **stand_ins.host_names(release, capability),
        "_is_cuda": True,
        "_is_flashinfer_available": True,
        "is_dp_attention_enabled": lambda: False,
        "get_attn_tp_context": lambda: types.SimpleNamespace(input_scattered=False),
        "get_global_server_args": lambda: args,
        "global_server_args_dict": vars(args),  # 0.5.3 - 0.5.3.post1
        # 0.5.3.post2 - 0.5.4.post1 parse the algorithm; no speculative decoding here
        "SpeculativeAlgorithm": types.SimpleNamespace(
            from_string=lambda name: types.SimpleNamespace(is_eagle=lambda: False)
        ),
    }
    if Version(release) >= Version(FIXED):  # 0.5.8 moved the decision into a module-level function
        names["apply_flashinfer_allreduce_fusion"] = stand_ins.load_function(
            source, "apply_flashinfer_allreduce_fusion", names
        )
    module = ast.fix_missing_locations(ast.Module(body=[_method(source)], type_ignores=[]))
    for node in syntax.tree(source).body:  # FUSE_ALLREDUCE_MAX_BATCH_SIZE = 2048
        if isinstance(node, ast.Assign) and ast.unparse(node.targets[0]).startswith("FUSE_"):
            names[ast.unparse(node.targets[0])] = ast.literal_eval(node.value)
    exec(compile(module, COMMUNICATOR, "exec"), names)
    layer = types.SimpleNamespace(
        is_last_layer=False,
        _context=types.SimpleNamespace(tp_size=tp_size),
        _speculative_algo=None,
    )
    batch = types.SimpleNamespace(input_ids=types.SimpleNamespace(shape=(8,)))
    return bool(names["should_fuse_mlp_allreduce_with_next_layer"](layer, batch))


@pytest.mark.parametrize("release", SHAPES)
def test_unpatched_the_asked_flag_takes_a_fusion_that_does_not_build_on_12(release: str) -> None:
    for capability in stand_ins.SM120:
        assert fuses(release, capability)
        assert not fuses(release, capability, asked=False)
        assert not fuses(release, capability, tp_size=1)
        assert support.runs_on(*COMM, capability, release=release) is False
    assert fuses(release, (10, 0)) and support.runs_on(*COMM, (10, 0), release=release)


def test_0_5_8_ignores_the_flag_on_12_and_keeps_it_on_sm90_and_sm100() -> None:
    for capability in stand_ins.SM120:
        assert not fuses(FIXED, capability)
    assert fuses(FIXED, (9, 0)) and fuses(FIXED, (10, 0))


# --- patched: the refusal ------------------------------------------------------------------------


def path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


def _post_init(source: bytes) -> list[ast.stmt]:
    (server_args,) = [
        n
        for n in syntax.tree(source).body
        if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    ]
    (method,) = [
        n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == "__post_init__"
    ]
    return method.body


def _refusals(body: list[ast.stmt]) -> list[ast.If]:
    return [
        s
        for s in body
        if isinstance(s, ast.If)
        and FLAG in ast.unparse(s.test)
        and any(isinstance(n, ast.Raise) for n in ast.walk(s))
    ]


def refused(
    source: bytes, release: str, capability: tuple[int, int], asked: bool = True, tp_size: int = 2
) -> str | None:
    """Run the `__post_init__` refusals of `source` (none unpatched): the error, or None."""
    for check in _refusals(_post_init(source)):
        try:
            stand_ins.run_statement(
                check, _names(release, capability), {"self": _server_args(asked, tp_size)}
            )
        except ValueError as error:
            return str(error)
    return None


def _before_the_adjustments(body: list[ast.stmt]) -> bool:
    (refusal,) = _refusals(body)
    (adjust,) = [i for i, s in enumerate(body) if f"self.{ADJUSTMENTS}()" == ast.unparse(s)]
    return body.index(refusal) < adjust


@pytest.mark.parametrize("release", SHAPES)
def test_patched_12_refuses_the_flag_at_tp_above_1_in_one_line(release: str) -> None:
    source = wheels.patched(release, patch=PATCH)
    assert _before_the_adjustments(_post_init(source))
    for capability in stand_ins.SM120:
        assert refused(source, release, capability) == MESSAGE
        assert "\n" not in MESSAGE and "--enable-flashinfer-allreduce-fusion" in MESSAGE
        assert refused(source, release, capability, tp_size=4) == MESSAGE
        assert refused(source, release, capability, tp_size=1) is None
        assert refused(source, release, capability, asked=False) is None


@pytest.mark.parametrize("release", SHAPES)
def test_other_capabilities_start_as_before(release: str) -> None:
    source, pristine = wheels.patched(release, patch=PATCH), wheels.member(release, path(release))
    for capability in stand_ins.OTHERS:
        for asked in (True, False):
            assert refused(source, release, capability, asked) is None
            assert refused(pristine, release, capability, asked) is None
            assert fuses(release, capability, asked) == asked


def test_unpatched_nothing_refuses_the_flag() -> None:
    for release in SHAPES:
        assert _refusals(_post_init(wheels.member(release, path(release)))) == []
        assert refused(wheels.member(release, path(release)), release, (12, 0)) is None


def test_from_0_5_8_there_is_nothing_to_patch() -> None:
    for release in (FIXED, "0.5.13", "0.5.23"):
        assert PATCH.target_file(Version(release)) is None


def matrix_expected(release: Version) -> str:
    return "not for this release" if TARGET.get(release) is None else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, the asked flag at TP 2 takes the fused all-reduce on 12, refused by nothing."""
    name = str(release)
    for capability in stand_ins.SM120:
        assert fuses(name, capability)
        assert refused(pristine[path(name)], name, capability) is None


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    assert _before_the_adjustments(_post_init(source))
    for capability in stand_ins.SM120:
        assert refused(source, name, capability) == MESSAGE
        assert refused(source, name, capability, tp_size=1) is None
    for capability in stand_ins.OTHERS:
        assert refused(source, name, capability) is None


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
