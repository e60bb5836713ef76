"""sm120-nvfp4-moe-checkpoint-quant on the real wheels: an NVFP4 checkpoint without `--quantization`.

No release fixes this, so the proof is the releases' own code, patched, on stand-in devices whose
capability predicates are the release's own (`tests.support.stand_ins_moe`):

- the MoE backend resolution (`ServerArgs._handle_moe_kernel_config` to 0.5.14, the
  `_moe_runner_backend_quant_constraints` pass from 0.5.15), with `quantization=None` and a
  stand-in model config whose `.quantization` is the checkpoint's;
- `ModelOptNvFp4FusedMoEMethod.create_moe_runner`'s own `auto` resolution, which the chosen
  backend then meets;
- the whole start-up resolution (`tests.support.census`: every `_handle_*` step or 0.5.19+ hook,
  ModelConfig from the checkpoint's `quantization_config`), for a few releases.

On 0.5.11-0.5.12 the branch is inserted by `sm120-nvfp4-moe-backend`, already widened; there
the proof runs that patch's output. Nothing imports torch or SGLang.
"""

from __future__ import annotations

import ast
import itertools
from collections.abc import Callable, Mapping
from enum import Enum
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_nvfp4_moe_backend import Sm120Nvfp4MoeBackend
from sglpatch.patches.sm120_nvfp4_moe_checkpoint_quant import Sm120Nvfp4MoeCheckpointQuant
from tests.support import census, syntax, wheels
from tests.support import stand_ins_moe as stand_ins
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120Nvfp4MoeCheckpointQuant()
INSERTING = Sm120Nvfp4MoeBackend()  # inserts the branch on 0.5.11-0.5.12; runs first (by id)
FIRST = "0.5.13"  # the first release with upstream's branch, the first this patch edits
# One release per .postN family: tests/test_matrix.py proves the effect on every release.
RELEASES = [r for r in stand_ins.releases("0.5.11", wheels.RELEASES[-1]) if ".post" not in r]
OURS = [r for r in RELEASES if Version(r) >= Version(FIRST)]
SERVER_ARGS = "sglang/srt/server_args.py"
MODELOPT = "sglang/srt/layers/quantization/modelopt_quant.py"
MOE_UTILS = "sglang/srt/layers/moe/utils.py"
PASS = "_moe_runner_backend_quant_constraints"
METHOD = "_handle_moe_kernel_config"

FP4 = "modelopt_fp4"
# ModelOpt MIXED_PRECISION with NVFP4 layers (any model from 0.5.15; NemotronH alone before)
MIXED = "modelopt_mixed"
# What `--quantization` says, what ModelConfig resolved from the checkpoint, and the backend asked
# for. mxfp8 and nvfp4_online are left out: their branches import from SGLang or need SM100.
FLAGS = [None, FP4, MIXED, "modelopt", "modelopt_fp8", "fp8"]
CHECKPOINTS = [FP4, MIXED, "modelopt_fp8", "fp8", None]
BACKENDS = ["auto", "triton", "flashinfer_cutlass", "flashinfer_trtllm", "cutlass"]
GRID = list(itertools.product(FLAGS, CHECKPOINTS, BACKENDS))


def _path(release: str) -> str:
    return f"sglang/{INSERTING.target_file(Version(release))}"


def resolver(release: str) -> bytes:
    """The resolver's file as `apply` leaves it: to 0.5.12 with the branch sm120-nvfp4-moe-backend
    inserts, from 0.5.13 with upstream's, which this patch widens (sm120-nvfp4-moe-backend leaves
    that one alone: its matrix hooks say "already upstream" there)."""
    ours = PATCH if Version(release) >= Version(FIRST) else INSERTING
    return wheels.patched(release, patch=ours)


class _ModelConfig:
    """The memoised ModelConfig: its resolved quantization, and whether anyone read it."""

    def __init__(self, quantization: str | None) -> None:
        self._quantization = quantization
        self.reads = 0

    @property
    def quantization(self) -> str | None:
        self.reads += 1
        return self._quantization


class _Args:
    """The ServerArgs fields (or a 0.5.15+ resolution view's) the resolution reads."""

    def __init__(self, flag: str | None, checkpoint: _ModelConfig, backend: str) -> None:
        self.quantization = flag
        self.moe_runner_backend = backend
        self.ep_size = self.tp_size = 1
        self.moe_a2a_backend = "none"
        self.disable_shared_experts_fusion = False
        # 0.5.11-0.5.12.post1 end with a piecewise-CUDA-graph tweak that reads the model config's
        # hf_config; enforcing piecewise graphs skips it (0.5.13 moved it out of this method).
        self.enforce_piecewise_cuda_graph = True
        self.disable_piecewise_cuda_graph = False
        self.model_config = checkpoint

    def get_model_config(self) -> _ModelConfig:
        return self.model_config


class _Platform(stand_ins.StandInPlatform):
    """`get_platform()` with 0.5.22's `is_sm110` (Thor), which upstream's branch also asks."""

    def __init__(self, capability: tuple[int, int]) -> None:
        super().__init__(capability)
        self.is_sm110 = capability[0] == 11


@cache
def _method(source: bytes) -> Any:
    """`ServerArgs._handle_moe_kernel_config` alone, compiled once per source."""
    tree = syntax.tree(source)
    server_args = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs"
    )
    method = next(
        n for n in server_args.body if isinstance(n, ast.FunctionDef) and n.name == METHOD
    )
    return compile(ast.Module(body=[method], type_ignores=[]), SERVER_ARGS, "exec")


@cache
def _resolver(source: bytes, release: str, capability: tuple[int, int]) -> Callable[[_Args], None]:
    """The release's resolution on one stand-in device; it writes `moe_runner_backend`."""
    platform = _Platform(capability)
    names: dict[str, Any] = {
        **stand_ins.host_names(release, capability),
        "get_platform": lambda: platform,
        "model_config_of": lambda view: view.get_model_config(),  # 0.5.19+: the same memo
        "register_post_process": lambda function: function,  # the pass's decorator
    }
    if Version(release) < Version("0.5.15"):
        exec(_method(source), names)
        method = names[METHOD]
        return lambda args: method(args)
    function = stand_ins.load_function(source, PASS, names)

    def run(view: _Args) -> None:
        view.moe_runner_backend = function(view).get("moe_runner_backend", view.moe_runner_backend)

    return run


def resolve(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    flag: str | None,
    checkpoint: str | None,
    backend: str,
) -> tuple[str, str | None, int]:
    """(the backend chosen, the error the release raised or None, model-config reads)."""
    model_config = _ModelConfig(checkpoint)
    args = _Args(flag, model_config, backend)
    try:
        _resolver(source, release, capability)(args)
    except (AssertionError, ValueError) as error:  # the release's own validation
        return args.moe_runner_backend, f"{type(error).__name__}: {error}", model_config.reads
    return args.moe_runner_backend, None, model_config.reads


# --- what the NVFP4 MoE layer then does with the backend (the release's create_moe_runner) ----


@cache
def _backend_enum(release: str) -> type[Enum]:
    """The release's own `MoeRunnerBackend` (and its 0.5.20+ predicate mixin), compiled alone."""
    tree = syntax.tree(wheels.member(release, MOE_UTILS))
    wanted = {"_MoeRunnerBackendPredicates", "MoeRunnerBackend"}
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted]
    namespace: dict[str, Any] = {"Enum": Enum, "__name__": "stand_in_moe_utils"}
    exec(compile(ast.Module(body=classes, type_ignores=[]), MOE_UTILS, "exec"), namespace)
    enum: type[Enum] = namespace["MoeRunnerBackend"]
    return enum


@cache
def _auto_statement(release: str) -> ast.stmt:
    """`if moe_runner_backend.is_auto(): ...` at the head of the NVFP4 method's create_moe_runner."""
    tree = syntax.tree(wheels.member(release, MODELOPT))
    method_class = next(
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name == "ModelOptNvFp4FusedMoEMethod"
    )
    runner = next(
        n
        for n in method_class.body
        if isinstance(n, ast.FunctionDef) and n.name == "create_moe_runner"
    )
    return next(
        s
        for s in runner.body
        if isinstance(s, ast.If)
        and "is_auto" in ast.unparse(s.test)
        and "moe_runner_backend" in ast.unparse(s.test)
    )


def layer_backend(release: str, capability: tuple[int, int], backend: str) -> str:
    """What `create_moe_runner` runs for the server-wide `backend`, on a stand-in device."""
    enum = _backend_enum(release)
    names = {
        **stand_ins.host_names(release, capability),
        "MoeRunnerBackend": enum,
        "get_device_capability": lambda *_: capability,
    }
    after = stand_ins.run_statement(
        _auto_statement(release), names, {"moe_runner_backend": enum(backend)}
    )
    value: str = after["moe_runner_backend"].value
    return value


# --- the proofs ------------------------------------------------------------------------------


@pytest.mark.parametrize("capability", stand_ins.SM120)
@pytest.mark.parametrize("release", RELEASES)
def test_unpatched_capability_12_gives_an_nvfp4_checkpoint_trtllm_gen(
    release: str, capability: tuple[int, int]
) -> None:
    pristine = wheels.member(release, _path(release))
    # Started without --quantization: `auto` stays `auto`, and the layer makes it trtllm-gen.
    assert resolve(pristine, release, capability, None, FP4, "auto")[:2] == ("auto", None)
    assert layer_backend(release, capability, "auto") == "flashinfer_trtllm"
    assert support.runs_on("moe", "flashinfer_trtllm", capability, release=release) is False
    if Version(release) >= Version(FIRST):  # the flag alone reaches upstream's branch
        assert resolve(pristine, release, capability, FP4, FP4, "auto")[0] == "flashinfer_cutlass"
    # A mixed-precision checkpoint stays on `auto` even with its flag: upstream never names it.
    for flag in (None, MIXED):
        assert resolve(pristine, release, capability, flag, MIXED, "auto")[:2] == ("auto", None)


@pytest.mark.parametrize("release", RELEASES)
def test_a_mixed_checkpoints_moe_layers_are_the_nvfp4_method(release: str) -> None:
    """`ModelOptMixedPrecisionConfig.get_quant_method` gives NVFP4 MoE layers the NVFP4 method
    whose `auto` the test above follows (the release's own dispatch, read from its source)."""
    tree = syntax.tree(wheels.member(release, MODELOPT))
    (config,) = [
        n
        for n in tree.body
        if isinstance(n, ast.ClassDef) and n.name == "ModelOptMixedPrecisionConfig"
    ]
    returned = {
        ast.unparse(branch.test): ast.unparse(statement.value.func)
        for branch in ast.walk(config)
        if isinstance(branch, ast.If)
        for statement in branch.body
        if isinstance(statement, ast.Return) and isinstance(statement.value, ast.Call)
    }
    assert returned["quant_algo == 'NVFP4'"] == "ModelOptNvFp4FusedMoEMethod", returned


@pytest.mark.parametrize(
    ("flag", "checkpoint"), [(None, FP4), (FP4, FP4), (None, MIXED), (MIXED, MIXED)]
)
@pytest.mark.parametrize("capability", stand_ins.SM120)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_gets_flashinfer_cutlass_for_an_nvfp4_checkpoint(
    release: str, capability: tuple[int, int], flag: str | None, checkpoint: str
) -> None:
    chosen, error, _ = resolve(resolver(release), release, capability, flag, checkpoint, "auto")
    assert (chosen, error) == ("flashinfer_cutlass", None)
    assert support.runs_on("moe", chosen, capability, release=release) is True
    # The layer keeps a backend that is not `auto`: the weights are prepared for CUTLASS too.
    assert layer_backend(release, capability, chosen) == "flashinfer_cutlass"


@pytest.mark.parametrize("capability", stand_ins.SM120)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_keeps_everything_else(release: str, capability: tuple[int, int]) -> None:
    """A backend the user chose, a checkpoint that is not NVFP4, a `--quantization` given (even
    `modelopt`, which flashinfer_cutlass's check of the flag refuses): as before."""
    ours, theirs = resolver(release), wheels.member(release, _path(release))
    for flag, checkpoint, backend in GRID:
        if backend == "auto" and (flag or checkpoint) in (FP4, MIXED):
            continue  # the case the patch changes (or upstream's own, for the flag)
        case = (flag, checkpoint, backend)
        got = resolve(ours, release, capability, *case)[:2]
        assert got == resolve(theirs, release, capability, *case)[:2], case


@pytest.mark.parametrize("capability", stand_ins.OTHERS)
@pytest.mark.parametrize("release", RELEASES)
def test_other_capabilities_choose_exactly_what_they_chose(
    release: str, capability: tuple[int, int]
) -> None:
    ours, theirs = resolver(release), wheels.member(release, _path(release))
    for case in GRID:
        chosen, error, reads = resolve(ours, release, capability, *case)
        assert (chosen, error) == resolve(theirs, release, capability, *case)[:2], case
        assert reads == 0, case  # the model config is read behind the SM120 test only


@pytest.mark.parametrize("capability", stand_ins.CAPABILITIES)
@pytest.mark.parametrize("release", ["0.5.11", "0.5.12", "0.5.12.post1"])
def test_the_inserted_branch_chooses_what_0_5_13_patched_chooses(
    release: str, capability: tuple[int, int]
) -> None:
    """Where sm120-nvfp4-moe-backend inserts the branch, it decides as this patch's 0.5.13."""
    for case in GRID:
        ours = resolve(resolver(release), release, capability, *case)
        assert ours == resolve(resolver(FIRST), FIRST, capability, *case), case


# The whole start-up resolution, ModelConfig from the checkpoint: a MoE architecture with a
# model override of its own (Qwen3-MoE, SM100-only for quantization) and one without (Mixtral).
MOE_MODELS = ["Qwen3MoeForCausalLM", "MixtralForCausalLM"]


@cache
def _device(release: str, capability: tuple[int, int], fixed: bool) -> census.Release:
    """One release's modules on one stand-in device (built once: it loads many modules)."""
    replaced = {_path(release): resolver(release)} if fixed else {}
    return census.Release(release, capability, replaced)


def _start_up(
    release: str, capability: tuple[int, int], fixed: bool, arch: str, quantization: str
) -> str | None:
    outcome = _device(release, capability, fixed).evaluate(arch, quantization)
    assert outcome.not_evaluated is None and outcome.refused is None, outcome
    return {f: v for _, f, v in outcome.choices}.get("moe_runner_backend")


@pytest.mark.parametrize("release", ["0.5.11", "0.5.13", "0.5.15", "0.5.19", "0.5.23"])
def test_a_start_up_without_the_flag_resolves_cutlass_on_12_only(release: str) -> None:
    # Qwen3-MoE and Mixtral checkpoints are `modelopt_mixed` from 0.5.15 (w4afp8 before).
    named = (FP4, MIXED) if Version(release) >= Version("0.5.15") else (FP4,)
    for arch, checkpoint in itertools.product(MOE_MODELS, named):
        for capability in stand_ins.SM120:
            case = (arch, checkpoint, capability)
            assert _start_up(release, capability, False, arch, checkpoint) == "auto", case
            assert _start_up(release, capability, True, arch, checkpoint) == "flashinfer_cutlass"
    for arch in MOE_MODELS:
        for capability in stand_ins.SM120:
            for other in ("fp8", "bf16"):
                assert _start_up(release, capability, True, arch, other) == _start_up(
                    release, capability, False, arch, other
                )
    for capability in [(9, 0), (8, 9)]:  # 10.0: the census stand-ins stop at SM100-only code
        for arch, checkpoint in itertools.product(MOE_MODELS, named):
            assert _start_up(release, capability, True, arch, checkpoint) == _start_up(
                release, capability, False, arch, checkpoint
            )


@pytest.mark.parametrize("release", ["0.5.15", "0.5.19", "0.5.23"])
def test_a_start_up_on_10_0_is_unchanged(release: str) -> None:
    for arch in MOE_MODELS:
        for quantization in (FP4, "fp8"):
            key = (release, (10, 0))
            assert _start_up(*key, True, arch, quantization) == _start_up(
                *key, False, arch, quantization
            )


@pytest.mark.parametrize("release", [r for r in wheels.RELEASES if Version(r) < Version(FIRST)])
def test_before_0_5_13_this_patch_has_no_file(release: str) -> None:
    assert PATCH.target_file(Version(release)) is None


# --- tests/test_matrix.py --------------------------------------------------------------------


def matrix_expected(release: Version) -> str:
    """What `apply` reports for this patch on `release`."""
    return "applied" if release >= Version(FIRST) else "not for this release"


def _auto_on_12(release: Version, members: Mapping[str, bytes]) -> list[str]:
    path = _path(str(release))
    source = members.get(path, wheels.member(str(release), path))
    return [resolve(source, str(release), c, None, FP4, "auto")[0] for c in stand_ins.SM120]


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, an NVFP4 checkpoint without the flag stays on `auto` (trtllm-gen) on 12."""
    chosen = _auto_on_12(release, pristine)
    if chosen != ["auto", "auto"]:
        raise AssertionError(f"{release}: NVFP4 checkpoint `auto` on 12.0/12.1 -> {chosen}")


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Applied, it resolves to flashinfer_cutlass on 12.0 and 12.1."""
    chosen = _auto_on_12(release, patched)
    if chosen != ["flashinfer_cutlass", "flashinfer_cutlass"]:
        raise AssertionError(f"{release}: NVFP4 checkpoint `auto` on 12.0/12.1 -> {chosen}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
