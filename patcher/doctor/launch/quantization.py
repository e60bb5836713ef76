"""A checkpoint's quantization, named as SGLang names the method (its `--quantization` names).

How SGLang reads it, in `srt/configs/model_config.py` (`ModelConfig._parse_quant_hf_config`,
`_parse_modelopt_quant_config`, `_verify_quantization`):
- `hf_config.quantization_config`, else `compression_config` (compressed-tensors' older key).
  Multimodal configs lift their language model's: `KimiK25Config` copies
  `text_config.quantization_config` to the top (`srt/configs/kimi_k25.py`; 0.5.23 also
  `kimi_k3.py`, `minimax_vl.py`, `glm5_next.py`). The nested one is read here for any model
  whose top level has none (`where` says so): it is the checkpoint's own statement, though a
  release whose config class does not lift it loads those weights as it would unquantized ones.
- ModelOpt: a config without `quant_method` (0.5.3.post1 and later), or with
  `quant_method: "modelopt"` (0.5.10 and later), is named by its `quant_algo`:
  `MIXED_PRECISION` → `w4afp8` (`modelopt_mixed` for NemotronH from 0.5.10, and from 0.5.15 for
  any model where a layer is NVFP4), any
  `FP4`/`NVFP4` → `modelopt_fp4`, any `FP8` → `modelopt_fp8`. Before that, `modelopt` stays.
- Otherwise `quant_method`, lower-cased: `fp8`, `mxfp4`, `compressed-tensors`, `awq`, `gptq`,
  `quark`, ... Each method's `override_quantization_method` may rename it then: ModelOpt's only
  for the two names above, GPTQ/AWQ to `gptq_marlin`/`awq_marlin` on CUDA when Marlin takes the
  shape (and capability ≥ 8.0), `moe_wna16` only when the user asks for it. Those run-time
  renamings are not made here: the checkpoint's method is what a patch's `Concerns` names.
compressed-tensors picks a scheme per layer group (`config_groups`: weights' `num_bits`/`type`/
`group_size`, input activations'); `scheme` names them as `w4a16`, `w8a8-fp8`, `nvfp4`, ...
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

from sglpatch.doctor.launch.source import Source

MODEL_CONFIG = "sglang/srt/configs/model_config.py"


class Rules(NamedTuple):
    """How a release names ModelOpt checkpoints (read from its `model_config.py`)."""

    modelopt_without_method: bool = True  # `_parse_modelopt_quant_config` (0.5.3.post1 on)
    modelopt_flat: bool = True  # `quant_method: "modelopt"` named by `quant_algo` (0.5.10 on)
    modelopt_mixed: bool = True  # `modelopt_mixed` for MIXED_PRECISION (0.5.10 on)
    # ... for any model with an NVFP4 layer (0.5.15 on); before, for NemotronH alone
    mixed_by_layers: bool = True


NEWEST = Rules()


def release_rules(source: Source) -> Rules:
    """The release's rules, from its `model_config.py` (the newest rules when it is absent)."""
    text = source(MODEL_CONFIG)
    if text is None:
        return NEWEST
    return Rules(
        modelopt_without_method=b"def _parse_modelopt_quant_config" in text,
        modelopt_flat=b'quant_cfg["quant_method"] == "modelopt"' in text,
        modelopt_mixed=b"modelopt_mixed" in text,
        mixed_by_layers=b"has_modelopt_nvfp4_layers" in text,
    )


@dataclass(frozen=True)
class Quantization:
    """A checkpoint's quantization.

    method        SGLang's name (`fp8`, `modelopt_fp4`, `mxfp4`, `compressed-tensors`, ...)
    declared      `quant_method` as the checkpoint writes it ("" when it writes none)
    scheme        compressed-tensors: the groups' schemes (`w4a16`, `w8a8-fp8`, `nvfp4`,
                  joined by "+"); ModelOpt: its `quant_algo`; None otherwise
    weight_bits, weight_type, group_size, activation_bits, activation_type
                  the first quantized group's (compressed-tensors, ModelOpt groups), or GPTQ/AWQ's
                  `bits`/`group_size`
    block         FP8's `weight_block_size` ([128, 128] for DeepSeek-V3), else None
    where         the key it was read from: `quantization_config`,
                  `text_config.quantization_config`, `compression_config`, `hf_quant_config.json`
    """

    method: str
    declared: str
    scheme: str | None = None
    weight_bits: int | None = None
    weight_type: str | None = None
    group_size: int | None = None
    activation_bits: int | None = None
    activation_type: str | None = None
    block: tuple[int, ...] | None = None
    where: str = "quantization_config"

    def __str__(self) -> str:
        return f"{self.method} ({self.scheme})" if self.scheme else self.method


def checkpoint_quantization(
    config: Mapping[str, Any],
    rules: Rules = NEWEST,
    hf_quant_config: Mapping[str, Any] | None = None,
) -> Quantization | None:
    """The quantization `config` (a `config.json`) declares; None for an unquantized checkpoint.

    `hf_quant_config`: the model folder's `hf_quant_config.json` (older ModelOpt exports), read
    only when `config.json` declares nothing, as SGLang does.
    """
    found = _declared(config)
    if found is None and hf_quant_config is not None:
        inner = hf_quant_config.get("quantization")
        if isinstance(inner, Mapping):
            found = (dict(inner), "hf_quant_config.json")
    if found is None:
        return None
    quant, where = found
    declared = str(quant.get("quant_method", "") or "")
    method = declared.lower()
    algo = str(quant.get("quant_algo", "") or "")
    modelopt = (not declared and rules.modelopt_without_method) or (
        method == "modelopt" and rules.modelopt_flat
    )
    if where == "hf_quant_config.json":
        modelopt = True
    if modelopt:
        method = _modelopt(quant, algo, rules, _nemotron_h(config)) or method or "modelopt"
    groups = _groups(quant)
    first = groups[0] if groups else {}
    weights = _mapping(first.get("weights"))
    inputs = _mapping(first.get("input_activations"))
    return Quantization(
        method=method or "unknown",
        declared=declared,
        scheme=_scheme(groups) if method == "compressed-tensors" else (algo or None),
        weight_bits=_int(weights.get("num_bits", quant.get("bits"))),
        weight_type=_str(weights.get("type")),
        group_size=_int(weights.get("group_size", quant.get("group_size"))),
        activation_bits=_int(inputs.get("num_bits")),
        activation_type=_str(inputs.get("type")),
        block=_block(quant.get("weight_block_size")),
        where=where,
    )


def _declared(config: Mapping[str, Any]) -> tuple[dict[str, Any], str] | None:
    for key in ("quantization_config", "compression_config"):
        value = config.get(key)
        if isinstance(value, Mapping) and value:
            return dict(value), key
        if key == "quantization_config":
            text = config.get("text_config")
            nested = text.get(key) if isinstance(text, Mapping) else None
            if isinstance(nested, Mapping) and nested:
                return dict(nested), f"text_config.{key}"
    return None


def _modelopt(
    quant: Mapping[str, Any], algo: str, rules: Rules, nemotron_h: bool = False
) -> str | None:
    """`_parse_modelopt_quant_config`'s names for `quant_algo` (the upper-case test is SGLang's:
    `"FP4" in quant_algo`, so `W4A16_NVFP4` counts as FP4)."""
    if algo == "MIXED_PRECISION":
        if rules.modelopt_mixed and not rules.mixed_by_layers:  # 0.5.10 - 0.5.14
            return "modelopt_mixed" if nemotron_h else "w4afp8"
        layers = _mapping(quant.get("quantized_layers"))
        nvfp4 = any(
            str(_mapping(layer).get("quant_algo", "")).upper() in ("NVFP4", "W4A16_NVFP4")
            for layer in layers.values()
        )
        return "modelopt_mixed" if nvfp4 and rules.modelopt_mixed else "w4afp8"
    if "FP4" in algo or "NVFP4" in algo:
        return "modelopt_fp4"
    if "FP8" in algo:
        return "modelopt_fp8"
    return None


def _nemotron_h(config: Mapping[str, Any]) -> bool:
    """0.5.10 - 0.5.14's test: `model_type == "nemotron_h"` or an architecture `NemotronH*`."""
    architectures = config.get("architectures")
    names = architectures if isinstance(architectures, list) else []
    return config.get("model_type") == "nemotron_h" or any(
        isinstance(n, str) and n.startswith("NemotronH") for n in names
    )


def _groups(quant: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    groups = _mapping(quant.get("config_groups"))
    return [_mapping(group) for _, group in sorted(groups.items())]


def _scheme(groups: list[Mapping[str, Any]]) -> str | None:
    names = sorted({name for name in map(_group_scheme, groups) if name})
    return "+".join(names) or None


def _group_scheme(group: Mapping[str, Any]) -> str | None:
    """compressed-tensors' scheme of one group, as its `_get_scheme_from_parts` tells them
    apart: weight bits and type, activation bits and type, and FP4's group size (16: NVFP4,
    32: MXFP4)."""
    weights, inputs = _mapping(group.get("weights")), _mapping(group.get("input_activations"))
    bits, kind = _int(weights.get("num_bits")), _str(weights.get("type")) or "int"
    if bits is None:
        return None
    act_bits, act_kind = _int(inputs.get("num_bits")), _str(inputs.get("type")) or "int"
    if bits == 4 and kind == "float":
        if _int(weights.get("group_size")) == 32:
            return "mxfp4"
        return "nvfp4" if act_bits == 4 else "w4a16-nvfp4"
    if act_bits is None:
        return f"w{bits}a16" + ("-fp8" if kind == "float" else "")
    suffix = (
        "fp8" if kind == "float" or act_kind == "float" else "int8" if act_bits == 8 else act_kind
    )
    return f"w{bits}a{act_bits}-{suffix}"


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _str(value: object) -> str | None:
    return value if isinstance(value, str) else None


def _block(value: object) -> tuple[int, ...] | None:
    if isinstance(value, (list, tuple)) and value and all(isinstance(v, int) for v in value):
        return tuple(value)
    return None
