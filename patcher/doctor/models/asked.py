"""The architecture or models module `--model` / `--model-path` ask for, and where it was read.

`--model` is an architecture name (`KimiK25ForConditionalGeneration`), a models module's stem
(`kimi_k25`) or a Hugging Face id (`moonshotai/Kimi-K2.5`, read in the local hub cache);
`--model-path` is a checkpoint folder whose config.json names it, or a Hugging Face id when no
such folder exists (as SGLang's own --model-path).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import NamedTuple

from sglpatch.doctor.census import is_model_name, shown_name
from sglpatch.doctor.models import hub
from sglpatch.errors import UsageError
from sglpatch.reading import read_regular


class Asked(NamedTuple):
    """The model as doctor reads it: what it names, and the config.json that named it."""

    model: str | None  # an architecture or a models module's stem; None: every model
    config: Path | None  # None when --model named it itself


def model_asked(model: str | None, model_path: Path | None) -> Asked:
    """The architecture or models module `--model` / `--model-path` ask for, and the config.json
    it was read from (None when `--model` names it itself)."""
    if model_path is not None:
        if model is not None:
            raise UsageError("give --model or --model-path, not both")
        # A folder first, as SGLang does; `moonshotai/Kimi-K2.5` that is none is a hub id.
        # (os.path: Path.is_dir raises on a folder this user may not look into.)
        folder = os.path.isdir(model_path)  # noqa: PTH112
        if folder or not hub.is_repo_id(str(model_path)):
            config = model_path / "config.json"
            return Asked(_architecture(config, f"--model-path {model_path}"), config)
        return _from_hub(str(model_path), "--model-path")
    if model is None:
        return Asked(None, None)
    if "/" in model and hub.is_repo_id(model):
        return _from_hub(model, "--model")
    if hub.is_repo_id(model) and not model.isidentifier():
        # Not a module's stem nor a class: a hub name (`GLM-5.3-Flash`) or a near miss of one
        # (`kimi-k2.5`, which the census answers with its closest modules and classes).
        cached = hub.cached_as(model)
        if any("/" not in c for c in cached):  # an id without ORG (`bert-base-uncased`)
            return _from_hub(model, "--model")
        if cached:
            raise UsageError(
                f"--model {model} looks like a Hugging Face model name, not a models module or "
                f"architecture; the local Hugging Face cache holds {', '.join(cached)}: pass "
                f"--model {cached[0]}"
            )
    return Asked(model, None)


def _from_hub(repo_id: str, option: str) -> Asked:
    try:
        found = hub.find(repo_id)
    except hub.NotCached as why:
        folder = "no such folder, and " if option == "--model-path" else ""
        raise UsageError(
            f"{option} {repo_id}: {folder}not in the local Hugging Face cache ({why}); sglpatch "
            f"downloads nothing: fetch its config with `hf download {repo_id} config.json`, or "
            "pass --model-path DIR (a checkpoint folder) or --model ARCHITECTURE (its "
            "config.json's architectures[0])"
        ) from None
    said = f"{option} {repo_id} (cached as {found.config})"
    return Asked(_architecture(found.config, said), found.config)


def _architecture(config: Path, said: str) -> str:
    """The first architecture a checkpoint's config.json names, as SGLang picks its class.

    `said` starts each error line: the option and where the file is.
    """
    limit = 64 << 20  # bytes: a checkpoint's config.json is a few KB; never a FIFO's wait
    try:
        data = json.loads(read_regular(config, limit).decode("utf-8"))
    except FileNotFoundError:
        if not os.path.lexists(config):
            raise UsageError(f"{said}: no config.json there") from None
        raise UsageError(f"{said}: cannot read config.json: a link to nothing") from None
    except OSError as error:
        why = error.strerror or str(error)
        raise UsageError(f"{said}: cannot read config.json: {why}") from None
    except RecursionError:
        raise UsageError(f"{said}: cannot read config.json: nested too deeply") from None
    except ValueError as error:  # not UTF-8, not JSON
        why = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise UsageError(f"{said}: cannot read config.json: {why}") from None
    names = data.get("architectures") if isinstance(data, dict) else None
    if not isinstance(names, list) or not names or not isinstance(names[0], str):
        raise UsageError(f"{said}: config.json names no architectures")
    if not is_model_name(names[0]):
        raise UsageError(
            f"{said}: config.json's architecture {shown_name(names[0])} is not a class name"
        )
    return names[0]
