"""A vision tower's head size, read from the configs' own spellings (`models/shape.py`)."""

from __future__ import annotations

import pytest

from sglpatch.doctor.models.shape import Shape, holds, shape_of, vision_head_size
from sglpatch.patch import Concerns


@pytest.mark.parametrize(
    ("tower", "head"),
    [
        ({"vt_hidden_size": 1152, "vt_num_attention_heads": 16}, 72),  # Kimi K2.5 (MoonViT)
        ({"embed_dim": 1280, "hidden_size": 3584, "num_heads": 16}, 80),  # Qwen2-VL-7B
        ({"hidden_size": 1280, "num_heads": 16, "head_dim": 96}, 96),  # head_dim first
        ({"hidden_size": 4096, "num_attention_heads": 16}, 256),
        ({"hidden_size": 1000, "num_attention_heads": 16}, None),  # not a whole head size
        ({"hidden_size": 1152, "num_attention_heads": 0}, None),
        ({"hidden_size": True, "num_attention_heads": 1}, None),
        ({"hidden_size": 1152}, None),
        ("a string", None),
        (None, None),
    ],
)
def test_vision_head_size(tower: object, head: int | None) -> None:
    config = {"architectures": ["X"]} if tower is None else {"vision_config": tower}
    assert vision_head_size(config) == head


@pytest.mark.parametrize(
    ("config", "head"),
    [
        ({"kv_lora_rank": 512, "qk_rope_head_dim": 64, "head_dim": 128}, 576),  # DeepSeek-V3 MLA
        ({"head_dim": 64, "hidden_size": 2880, "num_attention_heads": 64}, 64),  # GPT-OSS
        ({"hidden_size": 4096, "num_attention_heads": 32}, 128),  # Llama
        ({"text_config": {"hidden_size": 3584, "num_attention_heads": 16}}, 224),  # nested
        ({"hidden_size": 4096}, None),
    ],
)
def test_attention_head_size(config: dict[str, object], head: int | None) -> None:
    assert shape_of(config).attention_head == head


def test_holds_judges_only_what_the_config_says() -> None:
    extend = Concerns(head_sizes=(256, 576), condition="...")
    vision = Concerns(vision_head_above=128, condition="...")
    assert holds(extend, Shape(attention_head=576)) is True
    assert holds(extend, Shape(attention_head=64)) is False
    assert holds(extend, Shape(vision_head=256)) is None  # not said
    assert holds(vision, Shape(vision_head=72)) is False
    assert holds(vision, Shape(vision_head=256)) is True
    assert holds(Concerns(), Shape(1, 2)) is None  # no shape needed
    both = Concerns(vision_head_above=128, head_sizes=(256,))
    assert holds(both, Shape(256, 256)) is True and holds(both, Shape(256, 64)) is False
    assert holds(both, Shape(None, 256)) is None
