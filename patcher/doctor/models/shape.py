"""What a checkpoint's config.json says of the model's shape where a patch's failure depends on
it: its vision tower's head size (the Triton prefill kernel's block fits 12's shared memory up
to head size 128) and its attention head size (the Triton extend kernel's Hopper blocks overflow
it at 256 and at MLA's 576)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, NamedTuple

from sglpatch.patch import Concerns

# How the towers' configs name their width and heads (Kimi K2.5's MoonViT: `vt_`; Qwen2-VL's
# ViT: `embed_dim`, `num_heads`, where `hidden_size` is the merger's output, the language
# model's width: `embed_dim` comes first).
_WIDTH = ("embed_dim", "hidden_size", "vt_hidden_size")
_HEADS = ("num_attention_heads", "vt_num_attention_heads", "num_heads")


class Shape(NamedTuple):
    """The head sizes a model's config gives (None: not given, or not in a form read here)."""

    vision_head: int | None = None
    attention_head: int | None = None


def shape_of(config: Mapping[str, Any]) -> Shape:
    text = config.get("text_config")
    language = text if isinstance(text, Mapping) else config
    return Shape(vision_head_size(config), attention_head_size(language))


def holds(concerns: Concerns, shape: Shape) -> bool | None:
    """Whether the model has the shape the patch's failure needs: True, False, or None (it needs
    none, or the config does not say)."""
    found: list[bool | None] = []
    if concerns.vision_head_above:
        head = shape.vision_head
        found.append(None if head is None else head > concerns.vision_head_above)
    if concerns.head_sizes:
        head = shape.attention_head
        found.append(None if head is None else head in concerns.head_sizes)
    if False in found:
        return False
    return True if found and all(found) else None


def vision_head_size(config: Mapping[str, Any]) -> int | None:
    """The head size of the vision tower `config` describes (its `vision_config`): `head_dim`,
    or the width over the heads; None when it describes none, or not in a form read here."""
    tower = config.get("vision_config")
    if not isinstance(tower, Mapping):
        return None
    return _head(tower)


def attention_head_size(config: Mapping[str, Any]) -> int | None:
    """The query head size of the language model's attention: MLA's `kv_lora_rank` plus
    `qk_rope_head_dim` (576 for DeepSeek-V3 and Kimi K2), else its `head_dim`, else the width
    over the heads."""
    rank, rope = config.get("kv_lora_rank"), config.get("qk_rope_head_dim")
    if isinstance(rank, int) and isinstance(rope, int) and _count(rank) and _count(rope):
        return rank + rope
    return _head(config)


def _head(config: Mapping[str, Any]) -> int | None:
    head = config.get("head_dim")
    if isinstance(head, int) and _count(head):
        return head
    width = next((config[k] for k in _WIDTH if _count(config.get(k))), None)
    heads = next((config[k] for k in _HEADS if _count(config.get(k))), None)
    if width is None or heads is None or width % heads:
        return None
    return int(width // heads)


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
