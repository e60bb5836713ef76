"""sm120-mxfp4-cutlass-layout on the real wheels: SM120 CUTLASS MXFP4 MoE keeps GPT-OSS's layout.

No release fixes this, so the proof is the releases' own code, patched and unpatched, on stand-in
devices whose capability predicates are the release's own (`tests.support.stand_ins_moe`):

- `Mxfp4MoEMethod.__init__` (which FlashInfer kernel `flashinfer_mxfp4` becomes on each GPU) and
  `create_moe_runner` (where the patch refuses), compiled from the wheel, with the release's own
  `MoeRunnerBackend` and `MoeRunnerConfig`, for each expert layout a model hands FusedMoE;
- `_process_weights_for_sm120_cutlass` itself, run on tensors of labels (pure-Python stand-ins
  for the slicing it does; FlashInfer's scale swizzle is the identity here): which checkpoint
  rows land in the `[up; gate]` halves the kernel reads, and the SwiGLU constants it sets;
- what the layouts are (read off `models/gpt_oss.py`, `models/kimi_k3.py`, FusedMoE), what
  Marlin does with each (its own de-interleave test), and what `auto` resolves to on 12 for
  MXFP4 MoE models (`tests.support.census`, the whole start-up resolution).

Nothing imports torch or SGLang.
"""

from __future__ import annotations
import __future__

import ast
import sys
import types
from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache
from typing import Any, Optional
from unittest import mock

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_mxfp4_cutlass_layout import Sm120Mxfp4CutlassLayout
from tests.support import census, syntax, wheels
from tests.support import stand_ins_moe as stand_ins
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120Mxfp4CutlassLayout()
FIRST = "0.5.17"  # the first release with the SM120 CUTLASS path (0.5.16 raises on 12 instead)
RELEASES = stand_ins.releases(FIRST, wheels.RELEASES[-1])
MXFP4 = "sglang/srt/layers/quantization/mxfp4.py"
BASE = "sglang/srt/layers/moe/moe_runner/base.py"
MOE_UTILS = "sglang/srt/layers/moe/utils.py"
MARLIN = "sglang/srt/layers/moe/moe_runner/marlin.py"
FUSED_MOE = "sglang/srt/layers/moe/fused_moe_triton/layer.py"
CLASS = "Mxfp4MoEMethod"
METHODS = ("__init__", "create_moe_runner", "_process_weights_for_sm120_cutlass")
BACKENDS = ["flashinfer_mxfp4", "marlin", "auto", "triton_kernel", "triton"]
REFUSAL = "pass --moe-runner-backend marlin"


@dataclass(frozen=True)
class Layout:
    """What a model hands FusedMoE (and so its MoeRunnerConfig) about its experts."""

    name: str
    activation: str
    gemm1_alpha: float | None
    gemm1_clamp_limit: float | None
    gate_up_interleaved: bool

    def __str__(self) -> str:
        return self.name


# GPT-OSS: activation=config.hidden_act ("silu"), gemm1_alpha=getattr(config,
# "hidden_act_alpha", 1.702), gemm1_clamp_limit=config.swiglu_limit (7.0), FusedMoE's default
# gate_up_interleaved=True (test_the_layouts_are_the_models_own reads these off the wheel).
GPT_OSS = Layout("gpt-oss", "silu", 1.702, 7.0, True)
# Kimi K3 (compressed-tensors MXFP4, forced onto Mxfp4Config): SiTU with the config's
# activation_situ_beta / activation_situ_linear_beta, w1/w3 loaded as halves. The two constants
# are the config's, not in the wheel; any value is another layout (the activation is SiTU).
KIMI_K3 = Layout("kimi-k3", "situ", 4.0, 10.0, False)
# Any other MoE checkpoint in compressed-tensors MXFP4 or `quant_method: mxfp4` (Qwen3-MoE,
# Mixtral, ...): FusedMoE's defaults, plain SiLU, w1/w3 loaded as halves (the flag is only read
# together with gemm1_alpha, as Marlin's de-interleave test shows).
PLAIN_SILU = Layout("plain-silu", "silu", None, None, True)
# GPT-OSS's constants with halves (as MiniMax M3 passes them): still not GPT-OSS's rows.
HALVES_GPT_OSS_CONSTANTS = Layout("halves-gpt-oss-constants", "silu", 1.702, 7.0, False)
# GPT-OSS's rows with another clamp: the preparation would still hand the kernel 7.0.
OTHER_LIMIT = Layout("gpt-oss-limit-10", "silu", 1.702, 10.0, True)
# GPT-OSS's rows and constants under SiTU: the runner would still compute SwiGLU.
SITU_INTERLEAVED = Layout("situ-interleaved", "situ", 1.702, 7.0, True)
LAYOUTS = [GPT_OSS, KIMI_K3, PLAIN_SILU, HALVES_GPT_OSS_CONSTANTS, OTHER_LIMIT, SITU_INTERLEAVED]
INTERLEAVED = [x for x in LAYOUTS if x.gemm1_alpha is not None and x.gate_up_interleaved]
OTHERS = [layout for layout in LAYOUTS if layout != GPT_OSS]


def _classes(path: str, release: str, wanted: set[str]) -> dict[str, Any]:
    """Top-level classes of a release's module, compiled alone (annotations left unevaluated)."""
    tree = syntax.tree(wheels.member(release, path))
    body: list[ast.stmt] = [
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in wanted
    ]
    namespace: dict[str, Any] = {"Enum": Enum, "dataclass": dataclass, "__name__": __name__}
    flags = __future__.annotations.compiler_flag
    exec(compile(ast.Module(body=body, type_ignores=[]), path, "exec", flags=flags), namespace)
    return namespace


@cache
def _backend_enum(release: str) -> type[Enum]:
    """The release's own `MoeRunnerBackend` (with its predicate mixin where it has one)."""
    enum: type[Enum] = _classes(
        MOE_UTILS, release, {"_MoeRunnerBackendPredicates", "MoeRunnerBackend"}
    )["MoeRunnerBackend"]
    return enum


@cache
def _config_class(release: str) -> type:
    config: type = _classes(BASE, release, {"MoeRunnerConfig"})["MoeRunnerConfig"]
    return config


def runner_config(release: str, layout: Layout) -> Any:
    """The release's own MoeRunnerConfig, as FusedMoE builds it for `layout`."""
    return _config_class(release)(
        activation=layout.activation,
        is_gated=True,
        gemm1_alpha=layout.gemm1_alpha,
        gemm1_clamp_limit=layout.gemm1_clamp_limit,
        gate_up_interleaved=layout.gate_up_interleaved,
    )


# --- tensors of labels, for the weight preparation -------------------------------------------


def _shape(cells: Any) -> tuple[int, ...]:
    shape: list[int] = []
    while isinstance(cells, list):
        shape.append(len(cells))
        cells = cells[0] if cells else None
    return tuple(shape)


def _get(cells: Any, keys: tuple[slice | int, ...]) -> Any:
    if not keys:
        return [_get(c, ()) for c in cells] if isinstance(cells, list) else cells
    key, rest = keys[0], keys[1:]
    if isinstance(key, int):
        return _get(cells[key], rest)
    return [_get(c, rest) for c in cells[key]]


def _set(cells: list[Any], keys: tuple[slice, ...], values: list[Any]) -> None:
    key, rest = keys[0], keys[1:]
    rows = range(*key.indices(len(cells)))
    assert len(rows) == len(values), (len(rows), len(values))
    for row, value in zip(rows, values, strict=True):
        if rest:
            _set(cells[row], rest, value)
        else:
            cells[row] = _get(value, ())


def _filled(shape: tuple[int, ...], value: Any) -> Any:
    if not shape:
        return value
    return [_filled(shape[1:], value) for _ in range(shape[0])]


class Labels:
    """A tensor whose cells are labels: enough of torch for slicing, stacking and constants."""

    def __init__(self, cells: Any, dtype: str = "uint8") -> None:
        self.cells = cells
        self.dtype = dtype
        self.device = "stand-in"

    @property
    def data(self) -> Labels:
        return self

    @property
    def shape(self) -> tuple[int, ...]:
        return _shape(self.cells)

    def __getitem__(self, key: Any) -> Labels:
        keys = key if isinstance(key, tuple) else (key,)
        return Labels(_get(self.cells, keys), self.dtype)

    def __setitem__(self, key: Any, value: Labels) -> None:
        keys = key if isinstance(key, tuple) else (key,)
        _set(self.cells, keys, value.cells)

    def reshape_as(self, other: Labels) -> Labels:
        assert other.shape == self.shape
        return self

    def view(self, dtype: Any) -> Labels:
        return self

    def flat(self) -> list[Any]:
        return list(_flatten(self.cells))


def _flatten(cells: Any) -> Any:
    if isinstance(cells, list):
        for c in cells:
            yield from _flatten(c)
    else:
        yield cells


def _torch() -> types.SimpleNamespace:
    def zeros(*shape: int, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(shape, 0), dtype)

    def full(shape: tuple[int, ...], value: Any, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(tuple(shape), value), dtype)

    def ones(*shape: int, dtype: Any = None, device: Any = None) -> Labels:
        return Labels(_filled(shape, 1.0), dtype)

    return types.SimpleNamespace(
        zeros=zeros,
        full=full,
        ones=ones,
        float32="float32",
        cuda=types.SimpleNamespace(empty_cache=lambda: None),
    )


# --- the release's Mxfp4MoEMethod on a stand-in device ---------------------------------------


@dataclass
class Runner:
    """What `create_moe_runner` built: MoeRunner(backend, config)."""

    backend: str
    config: Any


@dataclass(frozen=True)
class _A2A:
    megamoe: bool = False

    def is_megamoe(self) -> bool:
        return self.megamoe

    def supports_aiter(self) -> bool:
        return False


@cache
def _method_class(
    source: bytes, release: str, capability: tuple[int, int], backend: str, mega: bool = False
) -> type:
    """`Mxfp4MoEMethod` holding the release's own `__init__`, `create_moe_runner` and
    `_process_weights_for_sm120_cutlass`, every module-level name they read bound here."""
    enum = _backend_enum(release)
    tree = syntax.tree(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS]
    body: list[ast.stmt] = [
        n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in METHODS
    ]
    assert {n.name for n in body} == set(METHODS)  # type: ignore[attr-defined]
    holder = ast.ClassDef(name=CLASS, bases=[], keywords=[], body=body, decorator_list=[])
    if sys.version_info >= (3, 12):
        holder.type_params = []
    module = ast.fix_missing_locations(ast.Module(body=[holder], type_ignores=[]))
    names: dict[str, Any] = {
        **stand_ins.host_names(release, capability),
        "get_moe_runner_backend": lambda: enum(backend),
        "get_moe_a2a_backend": lambda: _A2A(mega),
        "get_exec": lambda: types.SimpleNamespace(
            moe=types.SimpleNamespace(flashinfer_mxfp4_moe_precision="default")
        ),
        "MoeRunner": Runner,
        "MoeRunnerBackend": enum,
        "_use_aiter": False,
        "_FI_HAS_SM90_CUTLASS_MXFP4": True,  # a FlashInfer with the SM90 helpers
        "replace": replace,
        "Optional": Optional,
        "Parameter": lambda tensor, requires_grad=False: tensor,
        "torch": _torch(),
        "__name__": "stand_in_mxfp4",
    }
    flags = __future__.annotations.compiler_flag
    exec(compile(module, MXFP4, "exec", flags=flags), names)
    result: type = names[CLASS]
    return result


def _imports() -> dict[str, types.ModuleType]:
    """The modules the methods import inside themselves: FlashInfer's scale swizzle (the
    identity here) and SGLang's runner module (imported to register its fused function)."""
    modules: dict[str, types.ModuleType] = {}
    runner = "sglang.srt.layers.moe.moe_runner.flashinfer_cutlass"
    parts = runner.split(".")
    for i in range(1, len(parts) + 1):
        modules[".".join(parts[:i])] = types.ModuleType(".".join(parts[:i]))
    flashinfer = types.ModuleType("flashinfer")
    flashinfer.block_scale_interleave = lambda scale: scale  # type: ignore[attr-defined]
    modules["flashinfer"] = flashinfer
    return modules


@dataclass(frozen=True)
class Built:
    """A layer's MoE method after `__init__` and `create_moe_runner`."""

    kernel: str | None  # `_fi_kernel`
    runner: str | None  # the MoeRunner backend built, if any
    error: str | None  # what was raised, "Type: message"


def build(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    backend: str,
    layout: Layout,
    mega: bool = False,
) -> Built:
    """The layer's method built on a stand-in device (`mega`: `--moe-a2a-backend megamoe`)."""
    cls = _method_class(source, release, capability, backend, mega)
    try:
        method = cls(prefix="model.layers.0.mlp.experts")
    except (NotImplementedError, RuntimeError) as error:  # e.g. flashinfer_mxfp4 on 8.9
        return Built(None, None, f"{type(error).__name__}: {error}")
    kernel = method._fi_kernel
    try:
        with mock.patch.dict(sys.modules, _imports()):
            method.create_moe_runner(None, runner_config(release, layout))
    except (ValueError, NotImplementedError) as error:
        return Built(kernel, None, f"{type(error).__name__}: {error}")
    runner = getattr(method, "runner", None)
    return Built(kernel, runner.backend.value if runner is not None else None, None)


N = 32  # intermediate rows per half (the padded size is set to it: nothing to pad)
K = 64  # hidden size (two E8M0 scales of 32 per row)


def _checkpoint_rows(layout: Layout) -> list[str]:
    """w13's rows as the checkpoint loads them for `layout`."""
    if layout in INTERLEAVED:
        return [f"{part}{i}" for i in range(N) for part in ("gate", "up")]
    return [f"gate{i}" for i in range(N)] + [f"up{i}" for i in range(N)]


@dataclass(frozen=True)
class Prepared:
    """What the SM120 preparation hands FlashInfer: the `[up; gate]` halves and the SwiGLU."""

    first_half: list[str]  # w13's first N rows (FlashInfer reads up here)
    second_half: list[str]  # its next N rows (gate)
    bias_halves: tuple[list[str], list[str]]
    scale_halves: tuple[list[str], list[str]]
    alpha: set[Any]
    beta: set[Any]
    limit: set[Any]


def prepare(source: bytes, release: str, layout: Layout) -> Prepared:
    """Run the release's `_process_weights_for_sm120_cutlass` on one expert of labels."""
    cls = _method_class(source, release, (12, 0), "flashinfer_mxfp4")
    method = cls(prefix="model.layers.0.mlp.experts")
    method._padded_intermediate, method._padded_hidden = N, K  # create_weights' round_up(., 128)
    rows = _checkpoint_rows(layout)

    def rows_of(columns: int) -> Labels:
        return Labels([[[row] * columns for row in rows]])

    layer = types.SimpleNamespace(
        num_local_experts=1,
        w13_weight=rows_of(K // 2),
        w13_weight_scale=rows_of(K // 32),
        w13_weight_bias=Labels([list(rows)], "bfloat16"),
        w2_weight=Labels([[["w2"] * (N // 2) for _ in range(K)]]),
        w2_weight_scale=Labels([[["w2-scale"] * (N // 32) for _ in range(K)]]),
        w2_weight_bias=Labels([["w2-bias"] * K], "bfloat16"),
    )
    with mock.patch.dict(sys.modules, _imports()):
        method._process_weights_for_sm120_cutlass(layer)

    def halves(tensor: Labels) -> tuple[list[str], list[str]]:
        first = [r[0] if isinstance(r, list) else r for r in tensor.cells[0][:N]]
        second = [r[0] if isinstance(r, list) else r for r in tensor.cells[0][N : 2 * N]]
        return first, second

    first, second = halves(layer.w13_weight)
    return Prepared(
        first,
        second,
        halves(layer.w13_weight_bias),
        halves(layer.w13_weight_scale),
        set(layer.swiglu_alpha.flat()),
        set(layer.swiglu_beta.flat()),
        set(layer.swiglu_limit.flat()),
    )


UP = [f"up{i}" for i in range(N)]
GATE = [f"gate{i}" for i in range(N)]


# --- the proofs ------------------------------------------------------------------------------


@pytest.mark.parametrize("layout", OTHERS, ids=str)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_unpatched_capability_12_runs_another_layout_as_gpt_oss(
    release: str, capability: tuple[int, int], layout: Layout
) -> None:
    """The symptom: with flashinfer_mxfp4 the layer is built for the SM120 CUTLASS kernel, no
    error, and the preparation reads the rows and the SwiGLU as GPT-OSS's (and the runner runs
    SwiGLU whatever the activation: test_the_sm120_runner_runs_swiglu_whatever_the_layer)."""
    pristine = wheels.member(release, MXFP4)
    built = build(pristine, release, capability, "flashinfer_mxfp4", layout)
    assert built == Built("cutlass_sm120", "flashinfer_mxfp4", None)
    prepared = prepare(pristine, release, layout)
    wrong_rows = prepared.first_half != UP or prepared.second_half != GATE
    wrong_swiglu = (prepared.alpha, prepared.limit) != (
        {layout.gemm1_alpha},
        {layout.gemm1_clamp_limit},
    )
    assert wrong_rows or wrong_swiglu or layout.activation != "silu"
    assert (prepared.alpha, prepared.beta, prepared.limit) == ({1.702}, {1.0}, {7.0})
    if layout.gemm1_alpha is None or not layout.gate_up_interleaved:  # w1/w3 as two halves
        assert set(prepared.first_half) & set(GATE)  # gate rows where FlashInfer reads up
        assert set(prepared.bias_halves[0]) & set(GATE)
        assert set(prepared.scale_halves[0]) & set(GATE)


@pytest.mark.parametrize("release", RELEASES)
def test_gpt_oss_rows_and_swiglu_are_what_the_preparation_was_written_for(release: str) -> None:
    """For GPT-OSS the preparation is right: up rows first, gate rows second, its constants."""
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        prepared = prepare(source, release, GPT_OSS)
        assert (prepared.first_half, prepared.second_half) == (UP, GATE)
        assert prepared.bias_halves == (UP, GATE) and prepared.scale_halves == (UP, GATE)
        assert (prepared.alpha, prepared.beta, prepared.limit) == ({1.702}, {1.0}, {7.0})


@pytest.mark.parametrize("layout", OTHERS, ids=str)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_refuses_another_layout_naming_marlin(
    release: str, capability: tuple[int, int], layout: Layout
) -> None:
    built = build(
        wheels.patched(release, patch=PATCH), release, capability, "flashinfer_mxfp4", layout
    )
    assert built.kernel == "cutlass_sm120" and built.runner is None
    assert built.error is not None and built.error.startswith("ValueError: ")
    assert built.error.endswith(REFUSAL) and "\n" not in built.error
    # The backend it names builds the same layer on the same device, unpatched and patched.
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        assert build(source, release, capability, "marlin", layout) == Built(None, "marlin", None)
    assert support.runs_on("moe", "marlin", capability, release=release) is True


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_keeps_gpt_oss_on_the_cutlass_kernel(
    release: str, capability: tuple[int, int]
) -> None:
    for source in (wheels.member(release, MXFP4), wheels.patched(release, patch=PATCH)):
        built = build(source, release, capability, "flashinfer_mxfp4", GPT_OSS)
        assert built == Built("cutlass_sm120", "flashinfer_mxfp4", None)


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_capability_12_with_another_backend_builds_what_it_built(
    release: str, capability: tuple[int, int]
) -> None:
    for backend in BACKENDS[1:]:
        for layout in LAYOUTS:
            ours = build(wheels.patched(release, patch=PATCH), release, capability, backend, layout)
            theirs = build(wheels.member(release, MXFP4), release, capability, backend, layout)
            assert ours == theirs and ours.error is None, (backend, layout)


@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_other_capabilities_build_exactly_what_they_built(
    release: str, capability: tuple[int, int]
) -> None:
    seen: set[Built] = set()
    for backend in BACKENDS:
        for layout in LAYOUTS:
            ours = build(wheels.patched(release, patch=PATCH), release, capability, backend, layout)
            theirs = build(wheels.member(release, MXFP4), release, capability, backend, layout)
            assert ours == theirs, (backend, layout)
            seen.add(ours)
    kernels = {b.kernel for b in seen}
    # Each device takes its own FlashInfer kernel (8.9 refuses flashinfer_mxfp4 in __init__).
    assert (
        kernels
        == {(8, 9): {None}, (9, 0): {None, "cutlass_sm90"}, (10, 0): {None, "trtllm_sm100"}}[
            capability
        ]
    )


def _fused_moe_keywords(source: bytes) -> list[dict[str, str]]:
    """The keyword arguments of each call passing `gemm1_alpha=` or `gate_up_interleaved=`."""
    found = []
    for node in ast.walk(syntax.tree(source)):
        if isinstance(node, ast.Call):
            keywords = {k.arg: ast.unparse(k.value) for k in node.keywords if k.arg}
            if {"gemm1_alpha", "gate_up_interleaved"} & set(keywords):
                found.append(keywords)
    return found


@pytest.mark.parametrize("release", RELEASES)
def test_the_layouts_are_the_models_own(release: str) -> None:
    """GPT-OSS passes its alpha/limit and FusedMoE's default interleaving; Kimi K3 passes SiTU
    constants and `gate_up_interleaved=False`; FusedMoE's default is interleaved."""
    gpt_oss = wheels.member(release, "sglang/srt/models/gpt_oss.py")
    (experts,) = _fused_moe_keywords(gpt_oss)
    assert experts["gemm1_alpha"] == "self.gemm1_alpha" and "gate_up_interleaved" not in experts
    assert experts["gemm1_clamp_limit"] == "self.gemm1_clamp_limit"
    assert experts["activation"] == "self.activation"
    text = gpt_oss.decode()
    assert "self.gemm1_alpha = getattr(config, 'hidden_act_alpha', 1.702)" in ast.unparse(
        syntax.tree(gpt_oss)
    )
    assert "self.gemm1_clamp_limit = config.swiglu_limit" in text
    kimi = _fused_moe_keywords(wheels.member(release, "sglang/srt/models/kimi_k3.py"))
    routed = [k for k in kimi if k.get("gemm1_alpha") == "config.activation_situ_beta"]
    assert routed and all(k["gate_up_interleaved"] == "False" for k in routed)
    assert runner_config(release, PLAIN_SILU).gate_up_interleaved is True  # the default
    (fused,) = [
        n
        for n in ast.walk(syntax.tree(wheels.member(release, FUSED_MOE)))
        if isinstance(n, ast.ClassDef) and n.name == "FusedMoE"
    ]
    (init,) = [n for n in fused.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"]
    arguments = init.args.args[len(init.args.args) - len(init.args.defaults) :]
    defaults = {a.arg: ast.unparse(d) for a, d in zip(arguments, init.args.defaults, strict=True)}
    defaults |= {
        a.arg: ast.unparse(d)
        for a, d in zip(init.args.kwonlyargs, init.args.kw_defaults, strict=True)
        if d is not None
    }
    assert defaults["gate_up_interleaved"] == "True"


@pytest.mark.parametrize("release", RELEASES)
def test_marlin_deinterleaves_gpt_oss_only_and_takes_each_activation(release: str) -> None:
    """Marlin's own test: de-interleave w13 when `gemm1_alpha` is set and the rows are
    interleaved; its runner accepts gated silu and situ with the layer's constants."""
    tree = syntax.tree(wheels.member(release, MXFP4))
    (test,) = [
        n.test
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and any(  # the call is the branch's own statement (not one of an enclosing `if`)
            isinstance(s, ast.Expr)
            and isinstance(s.value, ast.Call)
            and ast.unparse(s.value.func) == "deinterleave_moe_mxfp4_w13_for_marlin"
            for s in n.body
        )
    ]
    condition = compile(ast.Expression(body=test), MXFP4, "eval")
    for layout in LAYOUTS:
        this = types.SimpleNamespace(moe_runner_config=runner_config(release, layout))
        deinterleaves = eval(condition, {"self": this, "getattr": getattr})
        assert bool(deinterleaves) == (layout in INTERLEAVED), layout
    marlin = syntax.tree(wheels.member(release, MARLIN))
    accepted = [
        {c.value for c in n.comparators[0].elts}  # type: ignore[attr-defined]
        for n in ast.walk(marlin)
        if isinstance(n, ast.Compare)
        and ast.unparse(n.left) == "runner_config.activation"
        and isinstance(n.ops[0], ast.In)
        and isinstance(n.comparators[0], ast.Set)
    ]
    assert {"silu", "situ"} in accepted


@pytest.mark.parametrize("release", RELEASES)
def test_the_sm120_runner_runs_swiglu_whatever_the_layer(release: str) -> None:
    """The MXFP4 CUTLASS call passes `ActivationType.Swiglu` (SwigluStep only for a flag that
    Mxfp4MoEMethod never sets), never the layer's activation."""
    runner = wheels.member(release, "sglang/srt/layers/moe/moe_runner/flashinfer_cutlass.py")
    calls = [
        {k.arg: ast.unparse(k.value) for k in n.keywords if k.arg}
        for n in ast.walk(syntax.tree(runner))
        if isinstance(n, ast.Call) and any(k.arg == "swiglu_alpha" for k in n.keywords)
    ]
    mxfp4 = [c for c in calls if "mxfp8" in c.get("use_mxfp8_act_scaling", "")]
    assert len(mxfp4) == 1, calls
    activation = mxfp4[0]["activation_type"]
    assert "ActivationType.Swiglu" in activation and "runner_config" not in activation
    assert b"use_swiglu_step" not in wheels.member(release, MXFP4)


def _prepared_before_sm120(source: bytes, attribute: str) -> bool:
    """Whether process_weights_after_loading returns in a `... or self.<attribute>` branch
    before it reaches the `_fi_kernel == "cutlass_sm120"` one."""
    tree = syntax.tree(source)
    (cls,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == CLASS]
    (method,) = [
        n
        for n in cls.body
        if isinstance(n, ast.FunctionDef) and n.name == "process_weights_after_loading"
    ]
    tests = [ast.unparse(s.test) if isinstance(s, ast.If) else "" for s in method.body]
    sm120 = next(i for i, t in enumerate(tests) if "'cutlass_sm120'" in t)
    taken = [
        i
        for i, (t, s) in enumerate(zip(tests, method.body, strict=True))
        if f"self.{attribute}" in t
        and f"not self.{attribute}" not in t
        and isinstance(s, ast.If)
        and isinstance(s.body[-1], ast.Return)
    ]
    return bool(taken) and taken[0] < sm120


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
@pytest.mark.parametrize("release", RELEASES)
def test_megamoe_is_refused_only_where_it_reaches_the_sm120_preparation(
    release: str, capability: tuple[int, int]
) -> None:
    """From 0.5.18 `--moe-a2a-backend megamoe` prepares the experts for DeepGEMM and returns
    before the SM120 preparation: the patch leaves it as it was. 0.5.17 has no such branch
    (its DeepGEMM one asks for the deep_gemm runner), so there the refusal stands."""
    pristine = wheels.member(release, MXFP4)
    skips = _prepared_before_sm120(pristine, "use_mega_moe")
    assert skips == (Version(release) >= Version("0.5.18"))
    for layout in LAYOUTS:
        ours = build(
            wheels.patched(release, patch=PATCH),
            release,
            capability,
            "flashinfer_mxfp4",
            layout,
            True,
        )
        theirs = build(pristine, release, capability, "flashinfer_mxfp4", layout, True)
        if skips or layout == GPT_OSS:
            assert ours == theirs and ours.error is None, layout
        else:
            assert (ours.error or "").endswith(REFUSAL), layout


MOE_MODELS = ["Qwen3MoeForCausalLM", "KimiK3ForConditionalGeneration", "MiniMaxM3ForCausalLM"]


@cache
def _start_up(release: str, capability: tuple[int, int]) -> census.Release:
    return census.Release(release, capability)


@pytest.mark.parametrize("release", ["0.5.17", "0.5.19", "0.5.23"])
def test_auto_gives_flashinfer_mxfp4_on_12_to_gpt_oss_only(release: str) -> None:
    """Why the refusal names a flag: left on `auto`, an MXFP4 checkpoint reaches the SM120
    CUTLASS path on 12 only as GPT-OSS; other MoE models stay on `auto` (Triton)."""
    for capability in stand_ins.SM120:
        device = _start_up(release, capability)
        outcome = device.evaluate("GptOssForCausalLM", "mxfp4")
        assert {f: v for _, f, v in outcome.choices}["moe_runner_backend"] == "flashinfer_mxfp4"
        for arch in MOE_MODELS:
            outcome = device.evaluate(arch, "mxfp4")
            assert outcome.not_evaluated is None and outcome.refused is None, arch
            chosen = {f: v for _, f, v in outcome.choices}.get("moe_runner_backend", "auto")
            assert chosen == "auto", (arch, chosen)


@pytest.mark.parametrize("release", [r for r in wheels.RELEASES if Version(r) < Version(FIRST)])
def test_before_0_5_17_there_is_no_sm120_cutlass_path(release: str) -> None:
    assert PATCH.target_file(Version(release)) is None


def test_0_5_16_has_no_sm120_preparation() -> None:
    assert b"_process_weights_for_sm120_cutlass" not in wheels.member("0.5.16", MXFP4)
    assert b"_process_weights_for_sm120_cutlass" in wheels.member(FIRST, MXFP4)


# --- tests/test_matrix.py --------------------------------------------------------------------


def matrix_expected(release: Version) -> str:
    return "applied" if release >= Version(FIRST) else "not for this release"


def _on_12(release: Version, members: Mapping[str, bytes]) -> list[Built]:
    name = str(release)
    source = members.get(MXFP4, wheels.member(name, MXFP4))
    return [
        build(source, name, capability, "flashinfer_mxfp4", layout)
        for capability in stand_ins.SM120
        for layout in (GPT_OSS, KIMI_K3, PLAIN_SILU)
    ]


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, Kimi K3's and a plain-SiLU layout are built for the SM120 CUTLASS kernel."""
    built = _on_12(release, pristine)
    if any(b != Built("cutlass_sm120", "flashinfer_mxfp4", None) for b in built):
        raise AssertionError(f"{release}: flashinfer_mxfp4 on 12 -> {built}")


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    """Applied, GPT-OSS keeps the kernel; the other two are refused naming marlin."""
    built = _on_12(release, patched)
    for i, b in enumerate(built):
        if i % 3 == 0:
            ok = b == Built("cutlass_sm120", "flashinfer_mxfp4", None)
        else:
            ok = b.runner is None and (b.error or "").endswith(REFUSAL)
        if not ok:
            raise AssertionError(f"{release}: flashinfer_mxfp4 on 12 -> {built}")


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
