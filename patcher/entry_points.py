"""The modules installed distributions declare in an entry-point group, read from the
`entry_points.txt` of each dist-info (or egg-info) on `sys.path`, without importlib.metadata.

importlib.metadata opens every distribution's files as they come: a FIFO named
`entry_points.txt` (or `METADATA`) in any dist-info on `sys.path` hung every command that loads
the catalogue, waiting for a writer. Here each is read with `read_regular`, within a bound; an
`entry_points.txt` that is not a regular file, is too large or cannot be read is skipped with a
warning on stderr, as pip ignores an invalid distribution: the plugins it may declare are not
loaded, and the command goes on. (It also spares `status` importlib.metadata's imports: email,
csv, zipfile.)
"""

from __future__ import annotations

import os
import re
import sys
from typing import NamedTuple

from sglpatch.reading import read_regular

# Bytes. The largest packages' entry_points.txt (console scripts, many plugins) are tens of KB.
ENTRY_POINTS_LIMIT = 1 << 20
# What of METADATA is read for the distribution's name: its headers come first.
_METADATA_HEAD = 64 << 10

_FOLDERS = (".dist-info", ".egg-info")
_MODULE = re.compile(r"\s*([A-Za-z_][\w.]*)\s*(?::\s*[\w.]+\s*)?(?:\[.*\]\s*)?$")


class Declared(NamedTuple):
    """One entry point of the group: `name = value` in `distribution`'s entry_points.txt."""

    name: str
    value: str  # as written: `module`, `module:attribute`, perhaps `[extras]`
    distribution: str

    @property
    def module(self) -> str | None:
        """The module `value` names; None when it names none."""
        match = _MODULE.match(self.value)
        return match.group(1) if match else None


def declared(group: str) -> list[Declared]:
    """The group's entry points, in `sys.path` order; a distribution found twice counts once
    (the first, as importlib.metadata and pip do)."""
    found: list[Declared] = []
    seen: set[str] = set()
    for folder in sys.path:
        try:
            entries = sorted(os.scandir(folder or "."), key=lambda e: e.name)
        except OSError:  # missing, not a folder, a zip archive
            continue
        for entry in entries:
            if not entry.name.endswith(_FOLDERS):
                continue
            stem = entry.name.rsplit(".", 1)[0]
            key = _normalized(stem.split("-", 1)[0])
            if key in seen:
                continue
            seen.add(key)
            text = _entry_points(entry.path)
            points = _section(text, group) if text else []
            if points:
                name = _distribution_name(entry.path) or stem.split("-", 1)[0]
                found += [Declared(n, v, name) for n, v in points]
    return found


def _entry_points(folder: str) -> str | None:
    path = os.path.join(folder, "entry_points.txt")  # noqa: PTH118 - scandir gives strings
    try:
        return read_regular(path, ENTRY_POINTS_LIMIT).decode("utf-8", "replace")
    except (FileNotFoundError, NotADirectoryError):  # declares none (an egg-info file)
        return None
    except OSError as error:
        _warn(f"ignoring {path}: {error.strerror or error}; the plugins it declares are not loaded")
        return None


def _section(text: str, group: str) -> list[tuple[str, str]]:
    """The `name = value` lines of section `[group]` (the INI shape importlib.metadata reads)."""
    pairs = []
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
        elif section == group and "=" in line:
            name, _, value = line.partition("=")
            pairs.append((name.strip(), value.strip()))
    return pairs


def _distribution_name(folder: str) -> str | None:
    """METADATA's `Name:` (PKG-INFO's for an egg-info); None if it cannot be read."""
    for file in ("METADATA", "PKG-INFO"):
        try:
            head = read_regular(os.path.join(folder, file), _METADATA_HEAD, whole=False)  # noqa: PTH118
        except OSError:
            continue
        for line in head.decode("utf-8", "replace").splitlines():
            if not line.strip():
                break  # the headers end
            if line.lower().startswith("name:"):
                return line.partition(":")[2].strip() or None
    return None


def _normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "_", name).lower()


_warned: set[str] = set()


def _warn(message: str) -> None:
    """One line on stderr, once per process: the catalogue is loaded more than once by some."""
    if message not in _warned and sys.stderr is not None:
        _warned.add(message)
        sys.stderr.write(f"sglpatch: warning: {message}\n")
