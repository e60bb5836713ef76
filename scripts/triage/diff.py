"""The capability-12 hunks between consecutive SGLang releases, read from their wheels."""

from __future__ import annotations

import difflib
import hashlib
import itertools
import re
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.version import Version

from scripts.triage.branches import branch_conditions
from scripts.triage.errors import TriageError
from scripts.triage.patterns import gate_families, mentions_capability_12, names_sm100_only
from tests.support import wheels  # the one place that knows the wheel cache
from tests.support.releases import RELEASES  # the releases, named once

# Tests and benchmarks say nothing about what a release does on a capability-12 GPU.
SKIPPED_PATH = re.compile(r"(^|/)(test|tests|benchmark|benchmarks)/|(^|/)test_[^/]*\.py$")


@dataclass(frozen=True)
class Hunk:
    """One change hunk (3 lines of context) of one file between two consecutive releases."""

    release: str
    previous: str
    file: str  # path in the new release's wheel ("sglang/srt/...")
    old_file: str | None  # where it was in the previous release, if it moved
    id: str  # sha1 of the hunk's capability-12 lines: stable across runs and line shifts
    old_start: int
    new_start: int
    lines: tuple[str, ...]  # the lines the id hashes: those naming 12, else the gate lines
    gates: tuple[str, ...] = ()  # gate lines of a hunk whose id hashes lines naming 12
    families: tuple[str, ...] = ()  # "names-12" and the GATES families its lines match


def _sources(release: str) -> dict[str, bytes]:
    archive = zipfile.ZipFile(wheels.wheel(release))
    return {
        name: archive.read(name)
        for name in archive.namelist()
        if name.startswith("sglang/") and name.endswith(".py") and not SKIPPED_PATH.search(name)
    }


def _moves(old: Mapping[str, bytes], new: Mapping[str, bytes]) -> dict[str, str]:
    """New path -> old path for files that moved: gone from `old`, same file name in `new`."""
    gone: dict[str, list[str]] = defaultdict(list)
    for path in old.keys() - new.keys():
        gone[PurePosixPath(path).name].append(path)
    moves: dict[str, str] = {}
    for path in sorted(new.keys() - old.keys()):
        candidates = gone.get(PurePosixPath(path).name, [])
        if candidates:
            # Several gone files share the name: take the one whose parent name matches.
            parent = PurePosixPath(path).parent.name
            same = [c for c in candidates if PurePosixPath(c).parent.name == parent]
            moves[path] = sorted(same or candidates)[0]
    return moves


def _text(data: bytes | None) -> list[str]:
    return [] if data is None else data.decode("utf-8", errors="replace").splitlines()


@dataclass(frozen=True)
class _Raw:
    """A hunk before judging: the changed lines by index into the two files' lines."""

    path: str
    old_path: str | None
    old: list[str]
    new: list[str]
    removed: list[int]
    added: list[int]
    context: list[str]  # the unchanged lines around the change
    old_start: int  # 1-based first line of the hunk (context included) in each file
    new_start: int


def _raw_hunks(path: str, old_path: str | None, old: list[str], new: list[str]) -> Iterator[_Raw]:
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(3):
        removed = [i for tag, i1, i2, _, _ in group if tag != "equal" for i in range(i1, i2)]
        added = [j for tag, _, _, j1, j2 in group if tag != "equal" for j in range(j1, j2)]
        context = [old[i] for tag, i1, i2, _, _ in group if tag == "equal" for i in range(i1, i2)]
        start_old, start_new = group[0][1] + 1, group[0][3] + 1
        yield _Raw(path, old_path, old, new, removed, added, context, start_old, start_new)


def _gate_lines(raw: _Raw, release: str) -> tuple[list[str], set[str]]:
    """The changed lines of `raw` that match a gate family, and the families matched."""
    lines: list[str] = []
    families: set[str] = set()
    near = [*raw.context, *(raw.old[i] for i in raw.removed), *(raw.new[j] for j in raw.added)]
    names_sm100 = any(names_sm100_only(line, release) for line in near)
    for sign, text, indices in (("-", raw.old, raw.removed), ("+", raw.new, raw.added)):
        for index in indices:
            found = gate_families(text[index])
            if not names_sm100:
                found -= {"blackwell", "sm100-sm90"}
            if names_sm100 and gate_families(branch_conditions(text, index)):
                found.add("branch")
            if found:
                lines.append(f"{sign}{text[index].strip()}")
                families |= found
    return lines, families


def diff_releases(previous: str, release: str) -> list[Hunk]:
    """The capability-12 hunks between two consecutive releases: lines that name 12 or gates."""
    old, new = _sources(previous), _sources(release)
    moves = _moves(old, new)
    pairs: list[tuple[str, str | None, bytes | None, bytes | None]] = []
    for path in sorted(old.keys() | new.keys()):
        if path in new:
            before = old.get(path, old.get(moves.get(path, ""), None))
            if before != new[path]:
                pairs.append(
                    (path, moves.get(path) if path not in old else None, before, new[path])
                )
        elif path not in moves.values():
            pairs.append((path, None, old[path], None))  # deleted, not moved
    raw = [
        hunk
        for path, old_path, before, after in pairs
        for hunk in _raw_hunks(path, old_path, _text(before), _text(after))
    ]
    # A line removed in one place and added back in another (a moved function, a reordered
    # import) is no change of behaviour: only lines with no twin on the other side count.
    removed_anywhere = Counter(r.old[i].strip() for r in raw for i in r.removed)
    added_anywhere = Counter(r.new[j].strip() for r in raw for j in r.added)

    def changed(lines: Iterable[str]) -> list[str]:
        return [
            line
            for line in lines
            if not (added_anywhere if line[0] == "-" else removed_anywhere)[line[1:]]
        ]

    hunks: list[Hunk] = []
    seen: Counter[tuple[str, str]] = Counter()
    for r in raw:
        lines = [f"-{r.old[i].strip()}" for i in r.removed if mentions_capability_12(r.old[i])]
        lines += [f"+{r.new[j].strip()}" for j in r.added if mentions_capability_12(r.new[j])]
        real = changed(lines)
        gate_lines, families = _gate_lines(r, release)
        gates = [line for line in changed(gate_lines) if line not in real]
        if not real and not gates:
            continue
        # The id hashes the lines that name 12 when there are some (the ids the verdicts of
        # those hunks were written against), else the gate lines.
        digest = hashlib.sha1("\n".join(real or gates).encode()).hexdigest()[:10]
        seen[(r.path, digest)] += 1
        if seen[(r.path, digest)] > 1:  # the same lines twice in one file: number them
            digest = f"{digest}-{seen[(r.path, digest)]}"
        hunks.append(
            Hunk(
                release,
                previous,
                r.path,
                r.old_path,
                digest,
                r.old_start,
                r.new_start,
                tuple(real or gates),
                gates=tuple(gates) if real else (),
                families=tuple(
                    sorted(families if gates else set()) + (["names-12"] if real else [])
                ),
            )
        )
    return hunks


def releases(first: str, last: str) -> list[str]:
    """Known releases from `first` to `last`; a newer `last` (a new release) is appended."""
    known = sorted(set(RELEASES) | {first, last}, key=Version)
    return [r for r in known if Version(first) <= Version(r) <= Version(last)]


def collect(first: str, last: str) -> list[Hunk]:
    """The capability-12 hunks of every pair of consecutive releases from `first` to `last`."""
    chain = releases(first, last)
    for release in chain:  # every wheel first: a failed download stops the run before any diff
        _fetch(release)
    try:
        return [hunk for a, b in itertools.pairwise(chain) for hunk in diff_releases(a, b)]
    except zipfile.BadZipFile as error:
        raise TriageError(f"a cached wheel is not a zip file: {error}; delete it", code=1) from None


def _fetch(release: str) -> Path:
    try:
        return wheels.wheel(release)
    except (RuntimeError, AssertionError, OSError) as error:
        said = [line.strip() for line in str(error).splitlines() if line.strip()]
        reason = said[-1] if said else type(error).__name__  # pip's own last word
        raise TriageError(f"sglang {release}: pip download failed: {reason}", code=1) from None
