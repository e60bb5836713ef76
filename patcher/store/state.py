"""What a ledger records of a target: the state after each change, and its history's entries."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass
class FileRecord:
    original: str  # sha256 of the bytes before sglpatch touched the file
    patched: str  # sha256 of the bytes sglpatch wrote
    patches: list[str]
    # Keys a newer sglpatch wrote that this one does not know: kept, written back unchanged.
    extra: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class State:
    """What is applied to the target now, as recorded by the last apply or revert."""

    release: str | None = None
    patches: list[str] = field(default_factory=list)
    files: dict[str, FileRecord] = field(default_factory=dict)
    # Patches the user left out of an apply (--skip, --only, an interactive "n") on this release.
    skipped: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def to_json(self) -> bytes:
        files = {
            path: {**f.extra, "original": f.original, "patched": f.patched, "patches": f.patches}
            for path, f in self.files.items()
        }
        data = {
            **self.extra,
            "release": self.release,
            "patches": self.patches,
            "files": files,
            "skipped": self.skipped,
        }
        return (json.dumps(data, indent=2, sort_keys=True) + "\n").encode()

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> State:
        files = {}
        for path, record in data.get("files", {}).items():
            extra = {k: v for k, v in record.items() if k not in ("original", "patched", "patches")}
            files[path] = FileRecord(
                record["original"], record["patched"], list(record["patches"]), extra
            )
        known = ("release", "patches", "files", "skipped")
        extra = {k: v for k, v in data.items() if k not in known}
        skipped = list(data.get("skipped", []))  # absent in ledgers from before --skip
        return cls(data.get("release"), list(data.get("patches", [])), files, skipped, extra)

    def with_paths(self, rename: Callable[[str], str]) -> State:
        """The same state with every file path passed through `rename`."""
        files = {rename(path): record for path, record in self.files.items()}
        return State(self.release, self.patches, files, self.skipped, self.extra)


class Entry(NamedTuple):
    """One commit of a target's ledger."""

    commit: str
    date: str
    summary: str
    message: str
