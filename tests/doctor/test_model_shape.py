"""A vision tower's head size, read from the configs' own spellings (`models/shape.py`)."""

from __future__ import annotations

import pytest

from sglpatch.doctor.models.shape import vision_head_size


@pytest.mark.parametrize(
    ("tower", "head"),
    [
        ({"vt_hidden_size": 1152, "vt_num_attention_heads": 16}, 72),  # Kimi K2.5 (MoonViT)
        ({"embed_dim": 1280, "num_heads": 16}, 80),  # Qwen2-VL
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
