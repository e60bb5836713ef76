"""sm120-beam-trtllm-mha-fp8-kv on the real wheels: the release's own Beam override, run on stand-ins.

Unpatched, 0.5.23 gives capability 12 `trtllm_mha` for Beam whatever the KV cache: with
`--kv-cache-dtype fp8_e4m3` the release's own start-up check (compiled from it) then refuses,
and with a checkpoint that declares an FP8 KV cache the release's own KV-dtype resolution (run
from the wheel) makes the pool FP8, which the backend's SM120 prefill casts the query to before
calling FlashInfer's fmha_v2 (no FP8 kernel on SM120). Patched, 12 with an FP8 KV cache gets the
release's own default (FlashInfer, Triton without it) and passes the check; 12 with a 16-bit KV
cache, and 8.9, 9.0 and 10.0 with any, choose exactly what they chose before.
"""

from __future__ import annotations

import ast
import logging
import types
from collections.abc import Mapping
from functools import cache
from typing import Any

import pytest
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from sglpatch.patches.sm120_beam_trtllm_mha_fp8_kv import OVERRIDE, Sm120BeamTrtllmMhaFp8Kv
from tests.patches import test_sm120_default_mha_trtllm_gate as defaults
from tests.patches.test_sm120_step3_fa4_fallback import _not_set
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks

pytestmark = pytest.mark.wheel

PATCH = Sm120BeamTrtllmMhaFp8Kv()
FIRST = "0.5.23"  # the release that added the Beam override
AFFECTED = stand_ins.releases(FIRST, wheels.RELEASES[-1])
ARCHITECTURE = "BeamForCausalLM"
HOOK = "sglang/srt/arg_groups/attention_hook.py"
BACKEND = "sglang/srt/layers/attention/trtllm_mha_backend.py"
KV_DTYPE = "sglang/srt/mem_cache/kv_cache_dtype.py"
COMMON = "sglang/srt/utils/common.py"
REFUSAL = "TRTLLM FMHAv2 prefill on SM120 does not support"

# The KV caches a Beam start-up can ask for: (--kv-cache-dtype, config.json quantization_config).
FP8 = {
    "flag": ("fp8_e4m3", None),
    "checkpoint algo": ("auto", {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}),
    "checkpoint scheme": (
        "auto",
        {"quant_method": "modelopt", "kv_cache_scheme": {"type": "float", "num_bits": 8}},
    ),
}
SIXTEEN_BIT = {
    "default": ("auto", None),
    "bf16 flag": ("bf16", None),
    "checkpoint without kv": ("auto", {"quant_method": "modelopt", "quant_algo": "NVFP4"}),
    "flag over checkpoint": ("bf16", {"quant_method": "modelopt", "kv_cache_quant_algo": "FP8"}),
}
KV_CACHES = {**FP8, **SIXTEEN_BIT}
# What Beam's override gives each capability unpatched, whatever the KV cache (read off 0.5.23).
BEFORE = {(8, 9): None, (9, 0): "trtllm_mha", (10, 0): "trtllm_mha"}
BEFORE.update({c: "trtllm_mha" for c in stand_ins.SM120})


def path(release: str) -> str:
    target = OVERRIDE.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


@cache
def _quantization_config(release: str) -> Any:
    """The release's own `get_quantization_config`."""
    return stand_ins.load_function(wheels.member(release, COMMON), "get_quantization_config", {})


def override(source: bytes, release: str, capability: tuple[int, int], kv_cache: str) -> str | None:
    """The attention backend Beam's own override (compiled from `source`) sets, or None."""
    kv_cache_dtype, quantization_config = KV_CACHES[kv_cache]
    args = defaults.server_args(
        ARCHITECTURE,
        kv_cache_dtype=kv_cache_dtype,
        quantization=None,
        moe_runner_backend="auto",
        moe_a2a_backend="none",
    )
    hf_config = types.SimpleNamespace(architectures=[ARCHITECTURE])
    if quantization_config is not None:
        hf_config.quantization_config = quantization_config
    platform = defaults._Platform(capability)
    names = {
        **stand_ins.host_names(release, capability),
        "Any": Any,
        "Dict": dict,
        "_register_for": lambda *architectures: lambda function: function,
        "get_platform": lambda: platform,
        "resolving_view": lambda view: view,
        "is_attention_backend_not_set": _not_set(release),
        "get_quantization_config": _quantization_config(release),
    }
    overrides = stand_ins.load_function(source, "_beam_overrides", names)(args, hf_config)
    backend = overrides.get("attention_backend")
    assert backend is None or isinstance(backend, str)
    return backend


def choice(source: bytes, release: str, capability: tuple[int, int], kv_cache: str) -> str:
    """The backend a Beam start-up ends with: the override's, else the release's own default."""
    backend = override(source, release, capability, kv_cache)
    if backend is None:
        default = wheels.member(release, defaults.path(release))
        backend = defaults.default_backend(default, release, capability, ARCHITECTURE)
    return backend


def starts(release: str, capability: tuple[int, int], backend: str, kv_cache: str) -> bool:
    """The release's own SM120 fmha_v2 check (`if prefill_backend == "trtllm_mha" and ...`)."""
    check = stand_ins.find_statement(
        wheels.member(release, HOOK),
        lambda n: (
            isinstance(n, ast.If)
            and "is_sm120" in ast.unparse(n.test)
            and "fp8_e4m3" in ast.unparse(n.test)
            and any(REFUSAL in ast.unparse(s) for s in n.body)
        ),
        "SM120 fmha_v2 check",
    )
    cfg = types.SimpleNamespace(kv_cache_dtype=KV_CACHES[kv_cache][0])
    names = {**stand_ins.host_names(release, capability), "ValueError": ValueError}
    try:
        stand_ins.run_statement(check, names, {"prefill_backend": backend, "cfg": cfg})
    except ValueError as error:
        assert REFUSAL in str(error)
        return False
    return True


class _Torch(types.SimpleNamespace):
    """`torch` with the dtypes the KV-dtype resolution names, as their names."""

    def __init__(self) -> None:
        names = ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2", "bfloat16")
        super().__init__(**{n: n for n in names})


def pool_dtype(release: str, kv_cache: str) -> str:
    """The KV pool dtype the release's own `configure_kv_cache_dtype` resolves, for a model whose
    quant config carries the checkpoint's KV declaration (as modelopt's from_config reads it)."""
    kv_cache_dtype, quantization_config = KV_CACHES[kv_cache]
    declared = None
    if quantization_config is not None:
        scheme = quantization_config.get("kv_cache_scheme") or {}
        if quantization_config.get("kv_cache_quant_algo") == "FP8" or scheme.get("num_bits") == 8:
            declared = "FP8"
    torch = _Torch()
    names = {
        "torch": torch,
        "nn": types.SimpleNamespace(Module=object),
        "Optional": Any,
        "_is_hip": False,
        "fp8_dtype": torch.float8_e4m3fn,
        "TORCH_DTYPE_TO_KV_CACHE_STR": {torch.float8_e4m3fn: "fp8_e4m3", torch.bfloat16: "bf16"},
        "current_platform": types.SimpleNamespace(is_cpu=lambda: False),
        "logger": logging.getLogger("sglpatch.stand_in"),
    }
    function = stand_ins.load_function(
        wheels.member(release, KV_DTYPE), "configure_kv_cache_dtype", names
    )
    model = types.SimpleNamespace(quant_config=types.SimpleNamespace(kv_cache_quant_algo=declared))
    _, dtype = function(
        server_args_kv_cache_dtype=kv_cache_dtype,
        model=model,
        model_dtype=torch.bfloat16,
        is_draft_worker=False,
        is_dflash=False,
        speculative_draft_attention_backend=None,
    )
    assert isinstance(dtype, str)
    return dtype


@pytest.mark.parametrize("kv_cache", sorted(KV_CACHES))
@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_beam_gives_12_trtllm_mha_whatever_the_kv_cache(
    release: str, kv_cache: str
) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.CAPABILITIES:
        assert override(pristine, release, capability, kv_cache) == BEFORE[capability]


@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_12_with_an_fp8_kv_flag_is_refused_at_start_up(release: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.SM120:
        backend = choice(pristine, release, capability, "flag")
        assert backend == "trtllm_mha" and not starts(release, capability, backend, "flag")
    # The same check lets SM90 and SM100 through, and 12 with a 16-bit KV cache.
    assert starts(release, (9, 0), "trtllm_mha", "flag")
    assert starts(release, (10, 0), "trtllm_mha", "flag")
    assert starts(release, (12, 0), "trtllm_mha", "default")


@pytest.mark.parametrize("kv_cache", ["checkpoint algo", "checkpoint scheme"])
@pytest.mark.parametrize("release", AFFECTED)
def test_unpatched_12_with_a_checkpoint_fp8_kv_passes_the_check_with_an_fp8_pool(
    release: str, kv_cache: str
) -> None:
    """The check reads the flag ("auto") only; the pool the release then builds is FP8."""
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.SM120:
        backend = choice(pristine, release, capability, kv_cache)
        assert backend == "trtllm_mha" and starts(release, capability, backend, kv_cache)
    assert pool_dtype(release, kv_cache) == "float8_e4m3fn"
    assert pool_dtype(release, "default") == "bfloat16"


@pytest.mark.parametrize("release", AFFECTED)
def test_the_backend_prefills_12_with_fmha_v2_and_an_fp8_query(release: str) -> None:
    """SM120 is an fmha_v2 prefill platform, and an FP8 pool makes the prefill query FP8."""
    source = wheels.member(release, BACKEND).decode()
    assert "self.use_fmha_v2 = get_platform().is_sm90 or get_platform().is_sm120" in source
    tree = syntax.tree(wheels.member(release, BACKEND))
    (extend,) = [
        n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "forward_extend"
    ]
    text = ast.unparse(extend)
    assert "self.data_type == torch.float8_e4m3fn and (not self.is_xqa_impl or not " in text
    assert "flashinfer.prefill.trtllm_fmha_v2_prefill(" in text
    for capability in stand_ins.SM120:
        assert support.runs_on("attention", "trtllm_mha", capability, release=release) is True
        record = support.lookup("attention", "trtllm_mha", release)
        assert record is not None and "FP8" in record.needs


@pytest.mark.parametrize("release", AFFECTED)
def test_off_sm100_the_release_prefills_an_fp8_kv_cache_with_flashinfer(release: str) -> None:
    """The release's own NVFP4 KV-cache path: off SM100 an FP8 E4M3 workspace, on flashinfer."""
    source = wheels.member(release, "sglang/srt/arg_groups/kv_cache_hook.py")
    table = stand_ins.find_statement(
        source,
        lambda n: (
            isinstance(n, ast.Assign) and ast.unparse(n.targets[0]) == "_NVFP4_PREFILL_BACKEND"
        ),
        "NVFP4 prefill table",
    )
    assert isinstance(table, ast.Assign)
    assert ast.literal_eval(table.value)["fp8_e4m3"] == "flashinfer"
    assert "'nvfp4' if get_platform().is_sm100 else 'fp8_e4m3'" in ast.unparse(syntax.tree(source))


@pytest.mark.parametrize("flashinfer", [True, False])
@pytest.mark.parametrize("kv_cache", sorted(FP8))
@pytest.mark.parametrize("release", AFFECTED)
def test_patched_12_with_an_fp8_kv_cache_gets_the_release_default_and_starts(
    release: str, kv_cache: str, flashinfer: bool
) -> None:
    source = wheels.patched(release, patch=PATCH)
    default = wheels.member(release, defaults.path(release))
    for capability in stand_ins.SM120:
        assert override(source, release, capability, kv_cache) is None
        backend = defaults.default_backend(default, release, capability, ARCHITECTURE, flashinfer)
        assert backend == ("flashinfer" if flashinfer else "triton")
        assert starts(release, capability, backend, kv_cache)
        assert support.runs_on("attention", backend, capability, release=release) is True


@pytest.mark.parametrize("kv_cache", sorted(SIXTEEN_BIT))
@pytest.mark.parametrize("release", AFFECTED)
def test_patched_12_with_a_16_bit_kv_cache_keeps_trtllm_mha(release: str, kv_cache: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.SM120:
        before = override(pristine, release, capability, kv_cache)
        assert (
            override(wheels.patched(release, patch=PATCH), release, capability, kv_cache)
            == before
            == "trtllm_mha"
        )
        assert starts(release, capability, "trtllm_mha", kv_cache)


@pytest.mark.parametrize("kv_cache", sorted(KV_CACHES))
@pytest.mark.parametrize("release", AFFECTED)
def test_other_capabilities_choose_exactly_what_they_chose(release: str, kv_cache: str) -> None:
    pristine = wheels.member(release, path(release))
    for capability in stand_ins.OTHERS:
        assert choice(
            wheels.patched(release, patch=PATCH), release, capability, kv_cache
        ) == choice(pristine, release, capability, kv_cache)


def test_before_0_5_23_there_is_no_beam_override() -> None:
    assert PATCH.target_file(Version("0.5.22")) is None
    assert path(FIRST) not in wheels.members("0.5.22")


def matrix_expected(release: Version) -> str:
    return "not for this release" if release < Version(FIRST) else "applied"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, 12 with an FP8 KV flag gets trtllm_mha, which the release's check refuses."""
    name = str(release)
    for capability in stand_ins.SM120:
        backend = override(pristine[path(name)], name, capability, "flag")
        assert backend == "trtllm_mha" and not starts(name, capability, backend, "flag")


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    source = patched[path(name)]
    pristine = wheels.member(name, path(name))
    for capability in stand_ins.SM120:
        for kv_cache in FP8:
            backend = choice(source, name, capability, kv_cache)
            assert backend != "trtllm_mha" and starts(name, capability, backend, kv_cache)
            assert support.runs_on("attention", backend, capability)
        assert choice(source, name, capability, "default") == "trtllm_mha"
    for capability in stand_ins.OTHERS:
        for kv_cache in KV_CACHES:
            assert override(source, name, capability, kv_cache) == override(
                pristine, name, capability, kv_cache
            )


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
