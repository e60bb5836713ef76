"""A checkpoint's quantization, named as SGLang names it: our own config fixtures (shaped on
public checkpoints, each naming its source), the release rules read from real wheels, and the
names the patches declare in `Concerns.quantization`."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sglpatch import catalogue
from sglpatch.doctor.launch.arguments import read_arguments
from sglpatch.doctor.launch.quantization import (
    NEWEST,
    Quantization,
    Rules,
    checkpoint_quantization,
    release_rules,
)
from tests.support import wheels
from tests.support.releases import NEWEST as NEWEST_RELEASE
from tests.support.releases import SEED, UPGRADE

CONFIGS = Path(__file__).resolve().parents[2] / "fixtures" / "configs"
# fixture → (method, scheme, where)
EXPECTED = {
    "gpt-oss-120b": ("mxfp4", None, "quantization_config"),
    "kimi-k2.5": ("compressed-tensors", "w4a16", "text_config.quantization_config"),
    "deepseek-v3": ("fp8", None, "quantization_config"),
    "qwen3-30b-a3b-nvfp4-modelopt": ("modelopt_fp4", "NVFP4", "quantization_config"),
    "qwen3-moe-modelopt-mixed": ("modelopt_mixed", "MIXED_PRECISION", "quantization_config"),
    "llm-compressor-nvfp4": ("compressed-tensors", "nvfp4", "quantization_config"),
    "gemma-2-9b": None,
}


def config(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONFIGS / f"{name}.json").read_text())
    return loaded


def source(release: str):  # type: ignore[no-untyped-def]
    names = set(wheels.members(release))
    return lambda name: wheels.member(release, name) if name in names else None


def test_every_fixture_is_expected_and_names_its_source() -> None:
    assert {p.stem for p in CONFIGS.glob("*.json")} == set(EXPECTED)
    for name in EXPECTED:
        assert "_source" in config(name) and len(config(name)["_source"]) > 40, name


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_quantization(name: str) -> None:
    found = checkpoint_quantization(config(name))
    expected = EXPECTED[name]
    if expected is None:
        assert found is None
        return
    assert found is not None
    assert (found.method, found.scheme, found.where) == expected


def test_the_details_read() -> None:
    kimi = checkpoint_quantization(config("kimi-k2.5"))
    assert kimi is not None
    assert (kimi.weight_bits, kimi.weight_type, kimi.group_size, kimi.activation_bits) == (
        4,
        "int",
        32,
        None,
    )
    deepseek = checkpoint_quantization(config("deepseek-v3"))
    assert deepseek is not None and deepseek.block == (128, 128) and deepseek.declared == "fp8"
    fp4 = checkpoint_quantization(config("llm-compressor-nvfp4"))
    assert fp4 is not None and (fp4.weight_type, fp4.group_size, fp4.activation_bits) == (
        "float",
        16,
        4,
    )
    assert str(fp4) == "compressed-tensors (nvfp4)"


@pytest.mark.wheel
def test_names_are_sglangs_and_the_patches_use_them() -> None:
    """Every name a patch declares in `Concerns.quantization`, and every name read from a
    fixture, is one of the newest release's own `--quantization` choices."""
    choices = read_arguments(source(NEWEST_RELEASE), NEWEST_RELEASE).option("--quantization")
    assert choices is not None and isinstance(choices.choices, tuple)
    declared = {q for patch in catalogue.load() for q in patch.concerns.quantization}
    assert declared and declared <= set(choices.choices), declared - set(choices.choices)
    methods = {q.method for q in map(checkpoint_quantization, map(config, EXPECTED)) if q}
    assert methods <= set(choices.choices)
    # the checkpoints the users run are named as the patches concerning them say
    assert {"mxfp4", "fp8", "modelopt_fp4", "compressed-tensors"} <= declared & methods


@pytest.mark.wheel
def test_release_rules_follow_the_releases_model_config() -> None:
    """ModelOpt's `quant_method: "modelopt"` in config.json is named by its quant_algo from
    0.5.10 (`_parse_quant_hf_config`); a config without quant_method from 0.5.3.post1;
    MIXED_PRECISION is `modelopt_mixed` for NemotronH from 0.5.10 and, from 0.5.15, for any
    model with an NVFP4 layer."""
    seed, upgrade = release_rules(source(SEED)), release_rules(source(UPGRADE))
    assert seed == Rules(
        modelopt_without_method=True,
        modelopt_flat=False,
        modelopt_mixed=False,
        mixed_by_layers=False,
    )
    assert upgrade == release_rules(source("0.5.14")) == NEWEST._replace(mixed_by_layers=False)
    assert release_rules(source("0.5.15")) == NEWEST == release_rules(source(NEWEST_RELEASE))
    mixed = config("qwen3-moe-modelopt-mixed")
    assert checkpoint_quantization(mixed, upgrade).method == "w4afp8"  # type: ignore[union-attr]
    nemotron = {**mixed, "architectures": ["NemotronHForCausalLM"], "model_type": "nemotron_h"}
    assert checkpoint_quantization(nemotron, upgrade).method == "modelopt_mixed"  # type: ignore[union-attr]
    assert checkpoint_quantization(mixed, NEWEST).method == "modelopt_mixed"  # type: ignore[union-attr]
    assert not release_rules(source("0.5.3")).modelopt_without_method
    modelopt = config("qwen3-30b-a3b-nvfp4-modelopt")
    assert checkpoint_quantization(modelopt, seed) == Quantization(
        "modelopt", "modelopt", "NVFP4", 4, "float", 16, 4, "float", None, "quantization_config"
    )
    assert checkpoint_quantization(modelopt, upgrade).method == "modelopt_fp4"  # type: ignore[union-attr]


def test_modelopt_without_quant_method_and_hf_quant_config() -> None:
    flat = {"quantization_config": {"quant_algo": "FP8", "producer": {"name": "modelopt"}}}
    assert checkpoint_quantization(flat).method == "modelopt_fp8"  # type: ignore[union-attr]
    mixed = {
        "quantization_config": {
            "quant_algo": "MIXED_PRECISION",
            "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}},
        }
    }
    assert checkpoint_quantization(mixed).method == "modelopt_mixed"  # type: ignore[union-attr]
    assert checkpoint_quantization(mixed, Rules(modelopt_mixed=False)).method == "w4afp8"  # type: ignore[union-attr]
    legacy = {"quantization": {"quant_algo": "NVFP4", "group_size": 16}}
    found = checkpoint_quantization({"architectures": ["X"]}, hf_quant_config=legacy)
    assert found is not None and (found.method, found.where) == (
        "modelopt_fp4",
        "hf_quant_config.json",
    )
    assert checkpoint_quantization({"architectures": ["X"]}) is None


def test_compressed_tensors_schemes_and_the_old_key() -> None:
    def scheme(weights: dict[str, Any], inputs: dict[str, Any] | None) -> str | None:
        group = {"weights": weights, "input_activations": inputs}
        cfg = {
            "compression_config": {
                "quant_method": "compressed-tensors",
                "config_groups": {"g": group},
            }
        }
        found = checkpoint_quantization(cfg)
        assert found is not None and found.where == "compression_config"
        return found.scheme

    fp8 = {"num_bits": 8, "type": "float"}
    assert scheme(fp8, fp8) == "w8a8-fp8"
    assert scheme(fp8, None) == "w8a16-fp8"
    assert scheme({"num_bits": 8, "type": "int"}, {"num_bits": 8, "type": "int"}) == "w8a8-int8"
    assert scheme({"num_bits": 4, "type": "int"}, fp8) == "w4a8-fp8"
    assert scheme({"num_bits": 4, "type": "float", "group_size": 16}, None) == "w4a16-nvfp4"
    assert scheme({"num_bits": 4, "type": "float", "group_size": 32}, None) == "mxfp4"
