"""A release's `Mxfp4MoEMethod` on a stand-in device, for sm120-mxfp4-cutlass-layout.

`build` compiles the release's own `__init__`, `create_moe_runner` and
`_process_weights_for_sm120_cutlass` from the wheel (or a patched source) with its own
`MoeRunnerBackend` and `MoeRunnerConfig`, for one expert `Layout` a model hands FusedMoE;
`prepare` runs the SM120 preparation on tensors of labels (`tests.support.labels`) and says which
checkpoint rows land in the `[up; gate]` halves the kernel reads. Nothing imports torch or SGLang.
"""

from __future__ import annotations
import __future__

import ast
import sys
import types
from dataclasses import dataclass, replace
from enum import Enum
from functools import cache
from typing import Any, Optional
from unittest import mock

from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.labels import Labels, labels_torch

FIRST = "0.5.17"  # the first release with the SM120 CUTLASS path (0.5.16 raises on 12 instead)
RELEASES = stand_ins.releases(FIRST, wheels.RELEASES[-1])
MXFP4 = "sglang/srt/layers/quantization/mxfp4.py"
BASE = "sglang/srt/layers/moe/moe_runner/base.py"
MOE_UTILS = "sglang/srt/layers/moe/utils.py"
CLASS = "Mxfp4MoEMethod"
METHODS = ("__init__", "create_moe_runner", "_process_weights_for_sm120_cutlass")


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
        "torch": labels_torch(),
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
