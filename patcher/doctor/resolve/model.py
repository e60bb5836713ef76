"""The model the resolution is asked about: a stand-in ModelConfig for one checkpoint, MLA when
the release's own ModelConfig says so."""

from __future__ import annotations

import ast
import functools
from typing import Any

from sglpatch.doctor.resolve.files import ReleaseFiles, parsed
from sglpatch.doctor.resolve.stand_ins import Consulted

MODEL_CONFIG = "sglang/srt/configs/model_config.py"

# A checkpoint's `quantization_config` (config.json) for each quantization the census asks
# about, and what SGLang's ModelConfig resolves it to (`model_config.quantization`).
CHECKPOINTS: dict[str, tuple[dict[str, Any] | None, str | None]] = {
    "bf16": (None, None),
    "fp8": (
        {"quant_method": "fp8", "fmt": "e4m3", "activation_scheme": "dynamic",
         "weight_block_size": [128, 128]},
        "fp8",
    ),
    "modelopt_fp4": ({"quant_method": "modelopt", "quant_algo": "NVFP4"}, "modelopt_fp4"),
    # ModelOpt MIXED_PRECISION with NVFP4 experts (nvidia's Qwen3.5 NVFP4): so named from
    # 0.5.15 (0.5.10 - 0.5.14: NemotronH's alone).
    "modelopt_mixed": (
        {"quant_method": "modelopt", "quant_algo": "MIXED_PRECISION",
         "quantized_layers": {"model.layers.0.mlp.experts": {"quant_algo": "NVFP4"}}},
        "modelopt_mixed",
    ),
    "mxfp4": ({"quant_method": "mxfp4"}, "mxfp4"),
}  # fmt: skip


class StandInConfig:
    """A Hugging Face config holding just the attributes given; others raise AttributeError."""

    def __init__(self, **attributes: Any) -> None:
        # A nested config (text_config, vision_config) is an object, as transformers makes it;
        # quantization_config stays the dict SGLang reads.
        self.__dict__.update(
            {
                k: StandInConfig(**v) if isinstance(v, dict) and _nested(k) else v
                for k, v in attributes.items()
            }
        )

    def __getattribute__(self, name: str) -> Any:
        if name in _QUANTIZATION_SEEN_BY:
            QUANTIZATION.note(f"hf_config.{name}")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        MISSING.note(f"hf_config.{name}")
        raise AttributeError(f"the stand-in hf_config has no {name}")

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)

    def get_text_config(self) -> StandInConfig:
        text = object.__getattribute__(self, "__dict__").get("text_config")  # not a read of all
        return text if isinstance(text, StandInConfig) else self


def _nested(key: str) -> bool:
    return key.endswith("_config") and key != "quantization_config"


MISSING = Consulted()  # model attributes the code under test asked for and we do not model
# Whether the code under test read the checkpoint's quantization (the one thing in which the
# checkpoints of one model differ): where it did not, they all get the same outcome.
QUANTIZATION = Consulted()
_QUANTIZATION_SEEN_BY = frozenset({"quantization", "quantization_config", "__dict__", "to_dict"})


class StandInModelConfig:
    """SGLang's ModelConfig for one checkpoint: the fields the resolution reads."""

    def __init__(
        self, hf_config: StandInConfig, quantization: str | None, mla: bool, arch_enum: Any
    ):
        self.hf_config = self.hf_text_config = hf_config
        self.quantization = quantization
        self.attention_arch = arch_enum.MLA if mla else arch_enum.MHA
        self.is_hybrid_swa = False
        self.is_multimodal = False
        self.is_generation = True
        self.is_encoder_decoder = False
        self.context_len = 32768
        self.num_attention_heads = 32
        self.num_key_value_heads = 8
        self.head_dim = 128
        self.dtype = "bfloat16"
        self.model_path = "stand-in"
        # ModelConfig._detect_attention_sinks (0.5.16+): GPT-OSS always has sinks.
        self.has_attention_sinks = "GptOssForCausalLM" in hf_config.architectures
        # A text-only checkpoint: ModelConfig's multimodal and decision-head fields are off.
        self.is_multimodal_piecewise_cuda_graph_supported = False
        self.decision_config = None
        self.has_asymmetric_kv = False  # K and V rows of one width (MiMoV2 is the exception)
        self.is_multimodal_gen = False
        self.is_image_gen = False
        self.is_audio_model = False

    def get_num_kv_heads(self, tp_size: int) -> int:
        return max(1, self.num_key_value_heads // tp_size)

    def __getattribute__(self, name: str) -> Any:
        if name in _QUANTIZATION_SEEN_BY:
            QUANTIZATION.note(f"model_config.{name}")
        return object.__getattribute__(self, name)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        MISSING.note(f"model_config.{name}")
        raise AttributeError(f"the stand-in ModelConfig has no {name}")


def mla_architectures(files: ReleaseFiles) -> frozenset[str]:
    """The architectures the release's ModelConfig gives `AttentionArch.MLA`: the string
    constants of each `if` whose body sets `self.attention_arch = AttentionArch.MLA`."""
    return _mla_in(files.read(MODEL_CONFIG))


@functools.lru_cache(maxsize=8)  # by content: the same for every re-run of one release
def _mla_in(source: bytes) -> frozenset[str]:
    tree = parsed(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.If):
            continue
        sets_mla = any(
            isinstance(s, ast.Assign)
            and isinstance(s.targets[0], ast.Attribute)
            and s.targets[0].attr == "attention_arch"
            and isinstance(s.value, ast.Attribute)
            and s.value.attr == "MLA"
            for s in node.body
        )
        if sets_mla:
            found |= {
                c.value
                for c in ast.walk(node.test)
                if isinstance(c, ast.Constant) and isinstance(c.value, str)
            }
    return frozenset(found)
