"""The published config.json fields of the model families whose start-up SGLang decides from them
(`model_configs.json`, each family with the checkpoint and the source read).

`--all-models` evaluates an architecture with its family's fields: a real HunYuan-V4 sets
`learnable_sink`, and the release's `getattr(config, "learnable_sink", False)` must see it. A
field recorded as null was read in the source and is absent there: the release's default holds.
"""

from __future__ import annotations

import functools
import json
from importlib import resources
from typing import Any, NamedTuple

# Attributes the releases ask of every model, absent from most published configs: their default
# is what a checkpoint without them gets, so reading one is no reason to doubt a row.
EVERY_MODEL = frozenset(
    {
        "layer_types",
        "linear_attn_config",
        "dual_chunk_attention_config",
        "quantization_config",
        "text_config",
    }
)


class Family(NamedTuple):
    architectures: tuple[str, ...]
    checkpoint: str  # the Hugging Face repository read
    source: str  # where its config.json was read
    config: dict[str, Any]  # field -> published value; None: absent there

    @property
    def dsa(self) -> bool:
        """The DSA form: its config sets `index_topk`."""
        return self.config.get("index_topk") is not None

    def set_fields(self) -> dict[str, Any]:
        return {k: v for k, v in self.config.items() if v is not None}


@functools.cache
def families() -> tuple[Family, ...]:
    try:
        text = resources.files(__package__).joinpath("model_configs.json").read_text()
    except FileNotFoundError:
        return ()
    return tuple(
        Family(tuple(entry["architectures"]), entry["checkpoint"], entry["source"], entry["config"])
        for entry in json.loads(text)["families"]
    )


def family(architecture: str, dsa: bool) -> Family | None:
    """The recorded family of one architecture in one form (DSA or not), if there is one."""
    return next((f for f in families() if architecture in f.architectures and f.dsa == dsa), None)
