"""The catalogue against the target, in memory: which patches still have work, and what each
one's change does to the scanner's findings.

A patch has work when its target file exists for the release, upstream has not fixed it, and
its codemod would still change the file (the engine says `Applied`, not `AlreadyApplied`). Each
such patch is run on its own over the file's current bytes (parsed once for all the patches on
that file) and the result is scanned again: a decision that disappears, or where capability
12.0 or 12.1 gets another branch or choice, is covered by that patch. Touching the same file or
function is not enough; the patch has to change what 12 gets at that decision.

A patch whose file cannot be read fails here (a blocker that names the file); a plugin's patch
that runs longer than `PLUGIN_TIME_LIMIT` is stopped and fails, named, as one that raised would.
"""

from __future__ import annotations

import signal
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, NamedTuple, Union

from packaging.version import Version

from sglpatch.doctor.findings import Finding, Kind
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, read_file
from sglpatch.errors import PatchCrashed
from sglpatch.patch import Patch
from sglpatch.results import Applied, Failed, Outcome

if TYPE_CHECKING:
    from sglpatch.engine import Parsed

PLUGIN_TIME_LIMIT = 10.0  # seconds for one plugin patch on one file; the built-ins take 0.05


Rescanner = Callable[[bytes, str], Sequence[Finding]]  # the scanner, on bytes of sglang/...
Opcodes = Sequence[tuple[str, int, int, int, int]]  # difflib's, from the file's lines to after's


class Rescan(NamedTuple):
    """What `covered_by` reads of a patched file, worked out where the patch ran."""

    findings: tuple[Finding, ...]  # the scanner's, in `after`
    before: bytes  # the file the patch ran on
    opcodes: Opcodes  # its lines to those of `after`


class PatchCheck(NamedTuple):
    patch: Patch
    file: str  # sglang/...
    outcome: Outcome
    after: bytes | None  # the file with this patch alone applied, if it has work and is read
    rescan: Rescan | None = None  # None: not worked out (no rescanner, or too deep to scan)


def check(
    package_dir: Path,
    release: Version,
    patches: Sequence[Patch],
    read_again: Callable[[bytes], bool] | None = None,
    rescan: Rescanner | None = None,
) -> list[PatchCheck]:
    """Every catalogue patch that is meant for this release, with its in-memory outcome.

    `read_again(before)` says whether the caller reads a file's patched bytes (`after`); where
    it says no, they are not written out. None: always. Given `rescan`, what `covered_by` needs
    of `after` is worked out here too (in the pool's worker, beside the scan).
    """
    from sglpatch import engine  # and libcst: in a worker, when the pool is open

    on_file = _by_file(patches, release)
    files: dict[str, _Parsed] = {}  # each file read and parsed once, for every patch on it
    checks = []
    for patch in patches:
        limit = _TimeLimit(None if patch.origin == "built-in" else PLUGIN_TIME_LIMIT)
        shown = ""
        parsed: _Parsed = None
        try:
            with limit:
                relative = patch.package_file(release)
                if relative is None or patch.fixed_upstream(release):
                    continue
                shown = f"sglang/{relative}"
                if relative not in files:
                    path = package_dir / relative
                    files[relative] = _parse(engine, path, shown, on_file, release)
                found, parsed = _check(engine, files[relative], shown, release, patch, read_again)
                files[relative] = parsed
        except (PatchCrashed, _TooSlow):
            if not limit.expired:
                raise
            why = f"stopped: its code ran longer than {PLUGIN_TIME_LIMIT:g} s"
            found = PatchCheck(patch, shown, Failed(patch.id, shown, why), None)
        if found is not None and rescan is not None:
            found = found._replace(rescan=_rescanned(found, parsed, rescan))
        if found is not None:
            checks.append(found)
    return checks


# A file parsed for its patches; why it cannot be patched; None: the release lacks the module.
_Parsed = Union["Parsed", str, None]


def _by_file(patches: Sequence[Patch], release: Version) -> dict[str, list[Patch]]:
    """The patches with work on each file: the file is parsed for what they read together. With
    a plugin's patch in the catalogue, none: every file is parsed whole (its code runs only
    under the time limit, and may edit any file)."""
    found: dict[str, list[Patch]] = {}
    if any(patch.origin != "built-in" for patch in patches):
        return found
    for patch in patches:
        if patch.fixed_upstream(release):
            continue
        relative = patch.package_file(release)
        if relative is not None:
            found.setdefault(relative, []).append(patch)
    return found


def _parse(
    engine: ModuleType,
    path: Path,
    shown: str,
    on_file: Mapping[str, Sequence[Patch]],
    release: Version,
) -> _Parsed:
    before, why = read_file(path)
    if before is None:
        return None if why is None else f"{shown} {why}"  # None: an optional part not installed
    relative = shown[len("sglang/") :]
    try:
        parsed: Parsed | str = engine.parse_for(before, on_file.get(relative, ()), release)
    except TOO_DEEP:
        return f"{shown} {TOO_DEEP_WHY}"
    return parsed  # str: a syntax error


def _check(
    engine: ModuleType,
    parsed: _Parsed,
    shown: str,
    release: Version,
    patch: Patch,
    read_again: Callable[[bytes], bool] | None,
) -> tuple[PatchCheck | None, _Parsed]:
    """The patch on its own over the parsed file, which stays as it was for the next patch
    (parsed whole from here on if the part parsed could not answer): its check, and the file."""
    if parsed is None:
        return None, None
    if isinstance(parsed, str):
        return PatchCheck(patch, shown, Failed(patch.id, shown, parsed), None), parsed
    render = read_again is None or read_again(parsed.source)
    try:
        outcome, after, parsed = engine.run_alone(parsed, shown, patch, release, render)
    except TOO_DEEP:
        why = f"{shown} {TOO_DEEP_WHY}"
        return PatchCheck(patch, shown, Failed(patch.id, shown, why), None), parsed
    return PatchCheck(patch, shown, outcome, after), parsed


def _rescanned(check_: PatchCheck, parsed: _Parsed, rescan: Rescanner) -> Rescan | None:
    if check_.after is None or parsed is None or isinstance(parsed, str):
        return None
    before = parsed.source
    try:
        findings = tuple(rescan(check_.after, check_.file))
    except TOO_DEEP:  # the caller scans it again, and notes why it cannot
        return None
    return Rescan(findings, before, _opcodes(before, check_.after))


class _TooSlow(BaseException):
    """Raised in a plugin's code when its time is up: BaseException, so its `except Exception`
    does not swallow it."""


class _TimeLimit:
    """Stop the code inside after `seconds` (None: no limit), by SIGALRM, again every second
    after the first if the code keeps going. Where SIGALRM cannot be used (not the main thread,
    no setitimer), there is no limit."""

    def __init__(self, seconds: float | None) -> None:
        self.seconds = seconds
        self.expired = False
        self._previous: object = None

    def __enter__(self) -> _TimeLimit:
        if self.seconds is None or not hasattr(signal, "setitimer"):
            self.seconds = None
            return self
        try:
            self._previous = signal.signal(signal.SIGALRM, self._expire)
        except ValueError:  # not the main thread
            self.seconds = None
            return self
        signal.setitimer(signal.ITIMER_REAL, self.seconds, 1.0)
        return self

    def __exit__(self, *exc: object) -> None:
        if self.seconds is not None:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, self._previous)  # type: ignore[arg-type]

    def _expire(self, signum: int, frame: object) -> None:
        self.expired = True
        raise _TooSlow


def pending(checks: Sequence[PatchCheck]) -> list[PatchCheck]:
    """The patches that would change something, or that cannot apply (both leave work to do)."""
    return [c for c in checks if isinstance(c.outcome, (Applied, Failed))]


def covered_by(
    findings: Sequence[Finding],
    checks: Sequence[PatchCheck],
    rescan: Callable[[bytes, str], Sequence[Finding]],
    read: Callable[[str], bytes | None] | None = None,
) -> dict[Finding, str]:
    """finding -> the first patch (by id) whose change alters what that decision gives 12.

    The patched file is scanned again and each decision is found there by its first line,
    carried across the patch's edit (`_LineMap`); a patch covers it when the decision is gone
    or 12.0 or 12.1 gets something else there. An edit elsewhere in the same function does
    not. `read` gives a file's current bytes (sglang/...): without it, or when it cannot, a
    finding is matched by what it says alone (its key). A check's `rescan` stands in for the
    scan, and for the line map while the file is still the one the patch ran on.
    """
    by_file: Mapping[str, list[Finding]] = _group(findings)
    covered: dict[Finding, str] = {}
    for check_ in sorted(checks, key=lambda c: c.patch.id):
        if check_.after is None or check_.file not in by_file:
            continue
        known = check_.rescan
        after = known.findings if known is not None else rescan(check_.after, check_.file)
        before = read(check_.file) if read is not None else None
        if before is None:
            remaining = _multiset(f.key for f in after)
            for finding in by_file[check_.file]:
                if remaining.get(finding.key, 0) > 0:
                    remaining[finding.key] -= 1
                else:
                    covered.setdefault(finding, check_.patch.id)
            continue
        unchanged = known is not None and known.before == before  # else changed since: map here
        lines = _LineMap(known.opcodes if known and unchanged else _opcodes(before, check_.after))
        for finding in by_file[check_.file]:
            first, last = lines.span(finding.head or finding.line)
            same = [
                f
                for f in after
                if first <= (f.head or f.line) <= last and _gives(f) == _gives(finding)
            ]
            if not same:
                covered.setdefault(finding, check_.patch.id)
    return covered


def _gives(finding: Finding) -> tuple[object, ...]:
    """What a decision gives capability 12: its branches' texts and choices, 12.0 and 12.1."""
    return (
        finding.kind is Kind.REFUSAL,
        finding.kind is Kind.TABLE,
        finding.gets,
        finding.gets_121,
        finding.chosen("12.0"),
        finding.chosen("12.1"),
    )


def _opcodes(before: bytes, after: bytes) -> Opcodes:
    import difflib

    old = before.decode("utf-8", errors="replace").splitlines()
    new = after.decode("utf-8", errors="replace").splitlines()
    return difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes()


class _LineMap:
    """Lines of a file before an edit -> the lines they became after it."""

    def __init__(self, opcodes: Opcodes) -> None:
        self.opcodes = opcodes

    def span(self, line: int) -> tuple[int, int]:
        """The after-lines (first, last, 1-based) that line `line` became; (0, -1): deleted."""
        index = line - 1
        for tag, i1, i2, j1, j2 in self.opcodes:
            if i1 <= index < i2:
                if tag == "equal":
                    return j1 + index - i1 + 1, j1 + index - i1 + 1
                if tag == "delete":
                    return 0, -1
                return j1 + 1, j2
        return 0, -1


def _group(findings: Sequence[Finding]) -> dict[str, list[Finding]]:
    grouped: dict[str, list[Finding]] = {}
    for finding in findings:
        grouped.setdefault(finding.file, []).append(finding)
    return grouped


def _multiset(keys: object) -> dict[tuple[str, str, str, str], int]:
    counts: dict[tuple[str, str, str, str], int] = {}
    for key in keys:  # type: ignore[attr-defined]
        counts[key] = counts.get(key, 0) + 1
    return counts
