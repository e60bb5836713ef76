"""The fields a checkpoint's config.json sets: which form of its class it is (DSA with
`index_topk`), for the patches whose `Concerns.config` names one."""

from __future__ import annotations

import json
from pathlib import Path

from sglpatch.reading import read_regular

_LIMIT = 4 * 1024 * 1024  # as for the config.json that named the model


def given_config(config: Path) -> frozenset[str] | None:
    """The top-level keys of `config` and of its `text_config`; None when it cannot be read
    (the model's form is then unknown, and every form's patches concern it)."""
    try:
        data = json.loads(read_regular(config, _LIMIT).decode("utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict):
        return None
    text = data.get("text_config")
    nested = text if isinstance(text, dict) else {}
    return frozenset(k for k, v in {**nested, **data}.items() if v is not None)
