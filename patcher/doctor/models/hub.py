"""A model's config.json from the local Hugging Face hub cache, for a model named as users write it
(`moonshotai/Kimi-K2.5`). Nothing is downloaded: what is not in the cache is not found.

The cache is where huggingface_hub puts it (its `constants.py`): `$HF_HUB_CACHE`, else the legacy
`$HUGGINGFACE_HUB_CACHE`, else `$HF_HOME/hub`, else `$XDG_CACHE_HOME/huggingface/hub`, else
`~/.cache/huggingface/hub`. A variable set to the empty string counts as unset here (there it
would name the current folder). Model `ORG/NAME` lives in `models--ORG--NAME/`: `snapshots/<rev>/`
holds each downloaded revision's files as symbolic links into `blobs/`, and `refs/main` names the
revision `main` was at the last download.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import NamedTuple

from sglpatch.reading import read_regular


class Cache(NamedTuple):
    folder: Path
    said_by: str  # the variable that chose it, or "the default"


class Snapshot(NamedTuple):
    """The config.json of a cached model, and which revision it is."""

    repo_id: str  # as the cache spells it (the hub matches names without regard to case)
    config: Path  # <cache>/models--ORG--NAME/snapshots/<revision>/config.json
    revision: str
    chosen_by: str  # "refs/main", or "the newest snapshot" when refs/main names none of them


class NotCached(Exception):
    """The model is not in the cache; `str()` says what is missing and where."""


def cache() -> Cache:
    """The hub cache huggingface_hub would use in this environment."""
    for variable in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if value := os.environ.get(variable):
            return Cache(_expanded(value), f"${variable}")
    if value := os.environ.get("HF_HOME"):
        return Cache(_expanded(value) / "hub", "$HF_HOME")
    if value := os.environ.get("XDG_CACHE_HOME"):
        return Cache(_expanded(value) / "huggingface" / "hub", "$XDG_CACHE_HOME")
    return Cache(Path.home() / ".cache" / "huggingface" / "hub", "the default")


def _expanded(value: str) -> Path:
    return Path(os.path.expandvars(Path(value).expanduser()))  # huggingface_hub's order


# A repository id as the hub accepts one (huggingface_hub's `validate_repo_id`): NAME or
# ORG/NAME, each of letters, digits and `_-.`, starting and ending with a letter, digit or `_`,
# without `--` or `..`, 96 characters at most. Nothing in it can leave the cache folder.
_PART = r"[A-Za-z0-9_](?:[A-Za-z0-9_.\-]*[A-Za-z0-9_])?"
_REPO_ID = re.compile(rf"(?:{_PART}/)?{_PART}")


def is_repo_id(text: str) -> bool:
    return (
        len(text) <= 96
        and "--" not in text
        and ".." not in text
        and _REPO_ID.fullmatch(text) is not None
    )


def find(repo_id: str) -> Snapshot:
    """The snapshot config.json of `repo_id` (an id `is_repo_id` accepts): that of the revision
    `refs/main` names, else of the newest snapshot holding one. Raises NotCached."""
    where = cache()
    folder = f"models--{repo_id.replace('/', '--')}"
    entries = _listing(where.folder)
    if entries is None:
        raise NotCached(f"no hub cache at {where.folder}, from {where.said_by}")
    # The cache keeps the id as it was typed at download time: match it without regard to case.
    matches = [e for e in entries if e == folder] or sorted(
        e for e in entries if e.lower() == folder.lower()
    )
    if not matches:
        raise NotCached(f"no {folder} in {where.folder}, from {where.said_by}")
    for match in matches:
        found = _snapshot(where.folder / match)
        if found is not None:
            revision, config, chosen_by = found
            cached_id = match.removeprefix("models--").replace("--", "/")
            return Snapshot(cached_id, config, revision, chosen_by)
    raise NotCached(f"no snapshot in {where.folder / matches[0]} holds a config.json")


def cached_as(name: str) -> list[str]:
    """The cached model ids whose NAME is `name` (without regard to case), as `ORG/NAME`."""
    entries = _listing(cache().folder) or []
    wanted = name.lower()
    return sorted(
        e.removeprefix("models--").replace("--", "/")
        for e in entries
        if e.startswith("models--") and e.lower().rsplit("--", 1)[-1] == wanted
    )


def _listing(folder: Path) -> list[str] | None:
    try:
        return [entry.name for entry in os.scandir(folder)]
    except OSError:  # absent, not a folder, or not readable: no cache to look in
        return None


def _snapshot(model: Path) -> tuple[str, Path, str] | None:
    """(revision, its config.json, how it was chosen) in one model's folder, or None."""
    snapshots = model / "snapshots"
    # A config.json that is there at all counts, even a dangling link into blobs/: reading it
    # says what is wrong with it, where skipping it would read an older revision unasked.
    holding = {
        name: snapshots / name / "config.json"
        for name in _listing(snapshots) or []
        if os.path.lexists(snapshots / name / "config.json")
    }
    if not holding:
        return None
    main = _ref(model / "refs" / "main")
    if main in holding:
        return main, holding[main], "refs/main"
    newest = max(holding, key=lambda name: (_mtime(holding[name]), name))
    return newest, holding[newest], "the newest snapshot"


def _ref(path: Path) -> str | None:
    """The revision a ref file names (a commit hash), or None when it cannot be read."""
    try:
        return read_regular(path, 1024).decode("ascii").strip() or None
    except (OSError, UnicodeDecodeError):
        return None


def _mtime(path: Path) -> float:
    try:
        return path.lstat().st_mtime  # when the link was made: when that revision came down
    except OSError:
        return 0.0
