"""What a checkpoint's config.json says of the model's shape where a patch's failure depends on
it: the vision tower's head size (the Triton prefill kernel's block fits 12's shared memory up
to head size 128)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

# How the towers' configs name their width and heads (Kimi K2.5's MoonViT: `vt_`; Qwen2-VL's
# ViT: `embed_dim`, `num_heads`).
_WIDTH = ("hidden_size", "vt_hidden_size", "embed_dim")
_HEADS = ("num_attention_heads", "vt_num_attention_heads", "num_heads")


def vision_head_size(config: Mapping[str, Any]) -> int | None:
    """The head size of the vision tower `config` describes (its `vision_config`): `head_dim`,
    or the width over the heads; None when it describes none, or not in a form read here."""
    tower = config.get("vision_config")
    if not isinstance(tower, Mapping):
        return None
    head = tower.get("head_dim")
    if isinstance(head, int) and _count(head):
        return head
    width = next((tower[k] for k in _WIDTH if _count(tower.get(k))), None)
    heads = next((tower[k] for k in _HEADS if _count(tower.get(k))), None)
    if width is None or heads is None or width % heads:
        return None
    return int(width // heads)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
