#!/usr/bin/env python3
"""List every upstream SGLang change that decides what compute capability 12 (SM120 / SM121) gets.

Diffs the Python sources of consecutive real SGLang wheels (0.5.3 -> 0.5.23 by default, read
with zipfile from $SGLPATCH_WHEEL_CACHE, a missing one fetched with `pip download --no-deps`),
keeps the change hunks whose added or removed lines mention capability 12 or are a gate that
lets 12 in without naming it (GATES: `is_blackwell*`, `is_sm100*` / `is_sm90*` next to SM100-only
code, `major >= 10` and the like, and the `elif` / `else` / body of such a gate), and writes one
Markdown table (docs/sm120-upstream.md). The verdicts are human judgements kept in
docs/sm120-verdicts.json, keyed by (release, file, hunk id); a hunk the file does not know (a
new release) appears as "unreviewed", so a re-run never loses an old verdict.

    .venv/bin/python scripts/sm120_triage.py              # regenerate docs/sm120-upstream.md
    .venv/bin/python scripts/sm120_triage.py --to 0.5.24  # a new release: review its rows
    .venv/bin/python scripts/sm120_triage.py --check      # exit 1 if the doc is stale/unreviewed
"""

from __future__ import annotations

import argparse
import difflib
import functools
import hashlib
import itertools
import json
import os
import re
import sys
import tempfile
import zipfile
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import NoReturn

from packaging.version import InvalidVersion, Version

from sglpatch.store.fsio import write_output  # as a shell's `>`, but whole

if not __package__:  # run as a file: run as the module instead (scripts/__init__.py says why)
    os.execv(sys.executable, [sys.executable, "-m", "scripts.sm120_triage", *sys.argv[1:]])

from tests.support import wheels  # the one place that knows the wheel cache
from tests.support.releases import RELEASES  # the releases, named once

REPO = Path(__file__).resolve().parent.parent

PROG = "scripts/sm120_triage.py"
DOC = REPO / "docs" / "sm120-upstream.md"
VERDICTS = REPO / "docs" / "sm120-verdicts.json"
FIRST, LAST = "0.5.3", "0.5.23"

# What counts as "mentions capability 12". Each pattern is searched in one changed line.
# Names: sm120 / sm_120 / SM121 / sm12x / is_sm120_supported / Sm120 / "SM 12.0".
NAMES = re.compile(r"(?i)sm_?12[01x]|\bsm\s?12\.[01x]\b")
# Device names of the capability-12 parts (RTX PRO 6000 / RTX 50xx = 12.0, GB10 / Spark = 12.1).
DEVICES = re.compile(r"(?i)rtx[ _-]?pro[ _-]?6000|rtx[ _-]?50[5-9]0|\bgb10\b|dgx[ _-]?spark")
# Arch strings: "12.0a", "120a", "12.1f", "sm_120a" (the last one already in NAMES).
ARCH = re.compile(r"""["'](12\.[01][af]?|12[01][af]?)["']|\b12[01][af]\b""")
# Numbers that are capability 12 only next to a capability word on the same line:
# `major == 12`, `get_device_sm() == 120`, `>= 120`, `(12, 0)`, `(120, 121)`, `in [10, 12]`.
CAPABILITY_WORD = re.compile(
    r"(?i)major|minor|capabilit|\barch\b|arch\b|_arch|\bsm\b|_sm\b|\bsm_|device_sm|\bcc\b"
)
CAPABILITY_NUMBER = re.compile(
    r"(==|!=|>=|<=|<|>)\s*\(?\s*12[01]?\b(?!\.\d)"  # == 12, >= 120, == (12, 0)
    r"|\b12[01]?\s*(==|!=|<=|>=)"  # 12 == major
    r"|[\[(]\s*(\d{1,3}\s*,\s*)*12[01]?\s*(,\s*\d{1,3}\s*)*[\])]"  # (12, 0), [10, 12], (120, 121)
)
# CUDA toolkit versions look the same (`CUDA_VERSION.major == 12`, `cuda >= (12, 0)`).
CUDA_VERSION = re.compile(r"(?i)cuda_?version|version\.cuda|cuda\s*>=|cuda_major|nvcc|toolkit")

# Gates that include capability 12 without naming it (issue 19). Each family is one named
# pattern, searched in one changed line of code (a comment line is no gate); `branch` also reads
# the file around the line. A hunk is listed when a changed line matches a family and has no
# twin on the other side of the release's diff, as for the names of 12 above.
GATES: dict[str, re.Pattern[str]] = {
    # `is_blackwell()`, `is_blackwell_supported()`, `get_platform().is_blackwell`: true on 10, 11
    # and 12 from 0.5.4.post2, so 12 takes whatever the branch picks.
    "blackwell": re.compile(r"\bis_blackwell\w*"),
    # `is_sm100_supported()`, `is_sm103`, `get_platform().is_sm90`, `is_hopper()`: they exclude
    # 12, so a change to one matters when it moves an SM100-only name (below) onto or off 12.
    "sm100-sm90": re.compile(r"\bis_sm(?:100|103|10x|90)\w*|\bis_hopper\w*"),
    # A capability word (GATE_WORD) next to a lower bound of 8 to 11 (it lets 12 in), or next
    # to a test of 9 or 10 (`==`, `!=`, `<`, `in`: the branch or its `else` decides for 12):
    # `major >= 10`, `major == 10`, `device_sm >= 100`, `get_device_sm() >= 100`,
    # `get_device_capability()[0] >= 10`, `sm_version >= 90`, `capability >= (10, 0)`,
    # `get_device_sm() not in (100, 103)`.
    "capability-10": re.compile(
        r"(>=|>)\s*\(?\s*(8|9|10|11|[89]\d|1[01]\d)\b(?!\.\d)"
        r"|(==|!=|<=|<)\s*\(?\s*(9|10|9\d|10\d)\b(?!\.\d)"
        r"|\b(9|10|90|100|103)\s*(==|!=|<=|>=)"
        r"|\bin\s*[\[({]\s*(\d{1,3}\s*,\s*)*(10|100|103)\s*[,\])}]"
    ),
}
# CAPABILITY_WORD without `minor` (`0 <= minor < 10` is no gate).
GATE_WORD = re.compile(
    r"(?i)major|capabilit|\barch\b|arch\b|_arch|\bsm\b|_sm\b|\bsm_|device_sm|\bcc\b"
)
# Names of code built for SM100 that the kernel-support table has no record of (trtllm-gen
# FMHA/MLA/MoE cubins and TRT-LLM comm kernels by any name, CUTLASS SM100 MLA, DeepGEMM spelled
# either way, FlashMLA, tcgen05/TMEM kernels, FP4 GEMM runners, MNNVL, CuTe DSL). The table's
# own records are added per release (`sm100_names`). `blackwell` and `sm100-sm90` lines count
# only in a hunk that names one of them.
SM100_FAMILIES = (
    r"trt_?llm|tllm|cutlass_mla|deep_?gemm|flash_?mla|fp4_gemm|mm_fp4|tcgen05|\btmem\b"
    r"|mnnvl|cutedsl|cute_dsl"
)


@functools.cache
def sm100_names(release: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """(SM100 code, code that runs on 12) by the kernel-support table's reading for `release`.

    SM100 code: a record that runs on 10.0 and, on a capability-12 part, does not or runs other
    kernels under its name (`fa4`: SGLang's SM120 port from 0.5.18; `trtllm_mha`: XQA from
    0.5.10), with `SM100_FAMILIES`. Code that runs on 12: a record that runs its own kernels on
    every capability-12 part; its name is cut from a line first, so no family word inside it
    counts. GEMM records are named by their flag's value (`fp8:deep_gemm` is `deep_gemm`).
    """
    from sglpatch.doctor.facts import gpus, kernel_support

    sm100: set[str] = set()
    on_12: set[str] = set()
    for kind, name in kernel_support.table():
        record = kernel_support.lookup(kind, name, release)
        if record is None:
            continue
        value = name.partition(":")[2] or name
        parts = [gpu.capability for gpu in gpus.ASKED]
        if all(record.judge(c) and not record.ported(c) for c in parts):
            on_12.add(value)
        elif record.runs(gpus.B200.capability) and any(
            record.judge(c) is False or record.ported(c) for c in parts
        ):
            sm100.add(value)
    on_12 -= sm100  # a value two flags share (fp4: and fp8:) counts as SM100 code if either is

    def words(names: set[str]) -> str:
        return "|".join(sorted(map(re.escape, names), key=lambda n: (-len(n), n)))

    return (
        re.compile(rf"(?i)\b(?:{words(sm100)})\b|{SM100_FAMILIES}"),
        re.compile(rf"(?i)\b(?:{words(on_12)})(?:_backend)?\b"),
    )


def names_sm100_only(line: str, release: str) -> bool:
    """Whether `line` names code built for SM100, on `release`, by the table and the families."""
    sm100, on_12 = sm100_names(release)
    return sm100.search(on_12.sub(" ", line)) is not None


# `branch`: a changed line that is an `elif`/`else` of, or a line directly in the body of, an
# `if` chain whose conditions match a family above (e.g. the `else:` after `if is_sm100():`,
# which 12 reaches), in a hunk that names SM100-only code. This is how a fix that changes what
# such a gate selects is found.
BRANCH_KEYWORD = re.compile(r"^\s*(if|elif|else)\b")

# Tests and benchmarks say nothing about what a release does on a capability-12 GPU.
SKIPPED_PATH = re.compile(r"(^|/)(test|tests|benchmark|benchmarks)/|(^|/)test_[^/]*\.py$")

# Backports with no upstream change to point at: they appear under the table, not in it.
NO_UPSTREAM = {
    "sm120-prefill-attention-block": "Triton prefill/context attention uses `BLOCK = 128` on every "
    "capability > 8 (163840 bytes of shared memory at head size 256); no release through 0.5.23 "
    "changes it, an upstream pull request proposes `BLOCK = 64` on capability 12.",
}

VERDICT_TEXT = {
    "backported": "backported",
    "to-backport": "to backport (not yet)",
    "needs-kernel": "needs a kernel or wheel the old release lacks",
    "new-feature": "new feature",
    "not-a-fix": "not a capability-12 fix",
    # For the hunks of GATES (gates that include 12 without naming it):
    "gap": "a gap: 12 gets SM100-only code",
    "upstream-fix": "upstream fix of a gate that let 12 in (to backport)",
    "forward-fixed": "forward-fixed",
    "excluded": "not a gap: 12 excluded before and after",
    "runs-on-12": "not a gap: what 12 gets runs on 12",
    "other-platform": "AMD or another platform",
    "unreviewed": "unreviewed",
}
# Verdicts that name the sglpatch patch doing the work.
NEEDS_PATCH = {"backported", "forward-fixed"}


class TriageError(Exception):
    """A reason the script stops, shown as one line; `code` is the exit status (2: a bad value)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code


def mentions_capability_12(line: str) -> bool:
    """True if one source line names capability 12 (see the patterns above)."""
    if NAMES.search(line) or DEVICES.search(line) or ARCH.search(line):
        return True
    return bool(
        CAPABILITY_WORD.search(line)
        and CAPABILITY_NUMBER.search(line)
        and not CUDA_VERSION.search(line)
    )


def gate_families(line: str) -> set[str]:
    """The families of GATES one line of code matches (a comment line matches none)."""
    code = line.split("#", 1)[0]
    if not code.strip():
        return set()
    found = {
        name for name, pattern in GATES.items() if name != "capability-10" and pattern.search(code)
    }
    if (
        GATES["capability-10"].search(code)
        and GATE_WORD.search(code)
        and not CUDA_VERSION.search(code)
    ):
        found.add("capability-10")
    return found


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _is_code(line: str) -> bool:
    stripped = line.strip()
    return bool(stripped) and not stripped.startswith("#")


def _header_above(lines: Sequence[str], index: int, level: int) -> int | None:
    """The `if`/`elif`/`else` line at indentation `level` that ends above `index`, if any.

    A header spanning lines (`if (` ... `):`) is found by its first line.
    """
    j = index - 1
    while j >= 0 and (not _is_code(lines[j]) or _indent(lines[j]) > level):
        j -= 1
    while j >= 0 and lines[j].lstrip()[:1] in ")]}":  # the closing line of a long header
        j -= 1
        while j >= 0 and (not _is_code(lines[j]) or _indent(lines[j]) > level):
            j -= 1
    if j < 0 or _indent(lines[j]) != level or not BRANCH_KEYWORD.match(lines[j]):
        return None
    return j


def _condition(lines: Sequence[str], header: int) -> str:
    """The header's text up to its colon (a long condition spans lines)."""
    text = []
    for line in lines[header : header + 12]:
        text.append(line.split("#", 1)[0])
        if text[-1].rstrip().endswith(":"):
            break
    return " ".join(text)


def branch_conditions(lines: Sequence[str], index: int) -> str:
    """The conditions of the `if` chain whose `elif`/`else` or direct body `lines[index]` is.

    Empty when the line is neither (an `if` line is its own condition, matched as a line).
    """
    line = lines[index]
    if not _is_code(line):
        return ""
    keyword = BRANCH_KEYWORD.match(line)
    if keyword and keyword.group(1) != "if":
        header: int | None = index
    else:
        above = index - 1
        while above >= 0 and (not _is_code(lines[above]) or _indent(lines[above]) >= _indent(line)):
            above -= 1
        if above < 0:
            return ""
        header = _header_above(lines, above + 1, _indent(lines[above]))
    conditions = []
    while header is not None:
        conditions.append(_condition(lines, header))
        if BRANCH_KEYWORD.match(lines[header]).group(1) == "if":  # type: ignore[union-attr]
            break
        header = _header_above(lines, header, _indent(lines[header]))
    return " ".join(conditions) if conditions else ""


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


@dataclass
class Change:
    """One row: hunks a human grouped as one upstream change, with the verdict."""

    release: str
    verdict: str
    description: str
    patch: str = ""
    hunks: list[tuple[str, str]] = field(default_factory=list)  # (file, hunk id)


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


def _json_type(value: object) -> str:
    """What `value` is in JSON's words, with its article ("an object", "a list")."""
    names = {dict: "an object", list: "a list", str: "a string", bool: "a boolean"}
    return "null" if value is None else names.get(type(value), "a number")


def load_verdicts(path: Path) -> list[Change]:
    """The reviewed changes in `path`; TriageError naming the file and the change if malformed."""
    where = f"--verdicts {path}"
    try:
        rows = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise TriageError(f"{where} does not exist") from None
    except IsADirectoryError:
        raise TriageError(f"{where} is a folder, not a JSON file") from None
    except OSError as error:
        raise TriageError(f"{where}: cannot read it: {error.strerror}") from None
    except UnicodeDecodeError:
        raise TriageError(f"{where} is not UTF-8 text") from None
    except json.JSONDecodeError as error:
        raise TriageError(
            f"{where} is not JSON: {error.msg} (line {error.lineno}, column {error.colno})"
        ) from None
    if not isinstance(rows, list):
        raise TriageError(f"{where} must hold a JSON list of changes, not {_json_type(rows)}")
    return [_change(row, f"{where}: change {n}") for n, row in enumerate(rows, 1)]


def _change(row: object, where: str) -> Change:
    if not isinstance(row, dict):
        raise TriageError(f"{where} must be a JSON object, not {_json_type(row)}")
    for key in ("release", "verdict", "description", "patch"):
        if key == "patch" and key not in row:
            continue
        if not isinstance(row.get(key), str):
            found = "missing" if key not in row else _json_type(row[key])
            raise TriageError(f"{where}: {key!r} must be a string, not {found}")
    try:
        Version(row["release"])
    except InvalidVersion:
        raise TriageError(f"{where}: 'release' {row['release']!r} is not a version") from None
    hunks = row.get("hunks")
    if not isinstance(hunks, list) or not all(
        isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)
        for pair in hunks
    ):
        raise TriageError(f"{where}: 'hunks' must be a list of [file, hunk id] pairs")
    return Change(
        release=row["release"],
        verdict=row["verdict"],
        description=row["description"],
        patch=row.get("patch", ""),
        hunks=[(file, hunk) for file, hunk in hunks],
    )


def unknown_verdicts(changes: Iterable[Change]) -> list[str]:
    problems = []
    for change in changes:
        if change.verdict not in VERDICT_TEXT or change.verdict == "unreviewed":
            problems.append(f"{change.release} {change.description}: verdict {change.verdict!r}")
        if change.verdict in NEEDS_PATCH and not change.patch:
            problems.append(
                f"{change.release} {change.description}: {change.verdict} without patch"
            )
    return problems


def rows(hunks: Sequence[Hunk], changes: Sequence[Change]) -> list[Change]:
    """The table: reviewed changes that still match a hunk, then one row per unreviewed file."""
    by_key = {(c.release, file, hunk): c for c in changes for file, hunk in c.hunks}
    found: dict[int, Change] = {}
    unreviewed: dict[tuple[str, str], Change] = {}
    for hunk in hunks:
        change = by_key.get((hunk.release, hunk.file, hunk.id))
        if change is not None:
            row = found.setdefault(
                id(change), Change(change.release, change.verdict, change.description, change.patch)
            )
        else:
            sample = next((line for line in hunk.lines if line[0] == "+"), hunk.lines[0])
            row = unreviewed.setdefault(
                (hunk.release, hunk.file),
                Change(hunk.release, "unreviewed", f"`{sample[:70].replace('|', '/')}`"),
            )
        row.hunks.append((hunk.file, hunk.id))
    table = [*found.values(), *unreviewed.values()]
    return sorted(table, key=lambda c: (Version(c.release), c.hunks[0][0], c.hunks[0][1]))


def _short(path: str) -> str:
    return path.removeprefix("sglang/").removeprefix("srt/")


def render(table: Sequence[Change], hunks: Sequence[Hunk], first: str, last: str) -> str:
    counts = Counter(row.verdict for row in table)
    hunk_counts: Counter[str] = Counter()
    for row in table:
        hunk_counts[row.verdict] += len(row.hunks)
    per_release = Counter(row.release for row in table)
    families = Counter(family for hunk in hunks for family in hunk.families)
    out = [
        "# SM120 / SM121 changes upstream, release by release",
        "",
        "Generated by `scripts/sm120_triage.py` from the real SGLang wheels "
        f"{first} → {last}; do not edit by hand. Verdicts live in `docs/sm120-verdicts.json` "
        "(keyed by release, file and hunk id); edit them there and re-run:",
        "",
        "    export SGLPATCH_WHEEL_CACHE=.cache/wheels   # wheels are fetched with pip if missing",
        "    .venv/bin/python scripts/sm120_triage.py                # this file",
        "    .venv/bin/python scripts/sm120_triage.py --to 0.5.24    # a new release: new hunks",
        "                                                           # show up as `unreviewed`",
        "",
        "How: every `.py` file under `sglang/` (tests and benchmarks left out) is diffed with the "
        "previous release (a file that moved is diffed with its old place, found by file name); "
        "a hunk (3 lines of context) is listed when an added or removed line mentions "
        "capability 12 and has no identical twin on the other side of the same release's diff "
        "(moved code and reordered imports are not changes). A line mentions capability 12 when "
        "it holds `sm120`/`sm_120`/`sm121`/`sm12x`/`SM 12.x` (any case, so "
        "`is_sm120_supported`), a capability-12 device name (RTX PRO 6000, RTX 50x0, GB10, DGX "
        'Spark), an arch string (`"12.0a"`, `120a`), or a capability word (`major`, `minor`, '
        "`capability`, `arch`, `sm`, `cc`) next to `== 12`, `>= 120`, `(12, 0)`, `(120, 121)`, "
        "`[10, 12]` (lines about the CUDA toolkit version are left out).",
        "",
        "A hunk is also listed when a changed line of code (not a comment) is a gate that "
        "includes 12 without naming it, in one of four families: **blackwell** (`is_blackwell()`, "
        "`is_blackwell_supported()`, `get_platform().is_blackwell`: true on 10, 11 and 12 from "
        "0.5.4.post2) and **sm100-sm90** (`is_sm100_supported()`, `is_sm103`, `is_sm90*`, "
        "`is_hopper()`), both only in a hunk that names code built for SM100 only (trtllm / "
        "trtllm-gen, `cutlass_mla`, DeepGEMM, FlashMLA, FP4 GEMM runners, tcgen05/TMEM, FA4, "
        "CuTe DSL, MNNVL); **capability-10** (a capability word next to a lower bound of 8 to 11, "
        "which lets 12 in, or a test of 9 or 10: `major >= 10`, `major == 10`, "
        "`device_sm >= 100`, `get_device_sm() >= 100`, `get_device_capability()[0] >= 10`, "
        "`sm_version >= 90`, `not in (100, 103)`); and **branch** (an `elif`/`else` of, or a "
        "line directly in the body of, an `if` chain whose condition is one of those gates, in a "
        "hunk that names SM100-only code: a fix that changes what the gate selects). A hunk "
        "that also names 12 keeps the id of its capability-12 lines.",
        "",
        "Verdicts: **backported** (the sglpatch patch id), **to backport (not yet)**, **needs a "
        "kernel or wheel the old release lacks**, **new feature**, **not a capability-12 fix** "
        "(a comment, a test helper, a rename, a CUDA-version check). For the gate hunks also: "
        "**a gap: 12 gets SM100-only code** (a release sends 12 to a kernel it cannot run), "
        "**upstream fix of a gate that let 12 in (to backport)**, **forward-fixed** (the sglpatch "
        "patch id), **not a gap: 12 excluded before and after**, **not a gap: what 12 gets runs "
        "on 12**, **AMD or another platform**.",
        "",
        "Rows: "
        + ", ".join(f"{VERDICT_TEXT[v]} {counts[v]}" for v in VERDICT_TEXT if counts[v])
        + f". Hunks: {len(hunks)} ("
        + ", ".join(f"{VERDICT_TEXT[v]} {hunk_counts[v]}" for v in VERDICT_TEXT if hunk_counts[v])
        + "). Rows per release: "
        + ", ".join(f"{r} {n}" for r, n in sorted(per_release.items(), key=lambda i: Version(i[0])))
        + ". Hunks per family (a hunk can match several): "
        + ", ".join(f"{name} {families[name]}" for name in ("names-12", *GATES, "branch"))
        + ".",
        "",
        "| Release | Files | Change | Verdict | Hunks |",
        "|---|---|---|---|---|",
    ]
    for row in table:
        files = sorted({file for file, _ in row.hunks})
        verdict = VERDICT_TEXT.get(row.verdict, row.verdict)
        if row.patch:
            verdict = f"{verdict} (`{row.patch}`)"
        ids = " ".join(f"`{hunk}`" for _, hunk in row.hunks)
        out.append(
            f"| {row.release} | {'<br>'.join(f'`{_short(f)}`' for f in files)} "
            f"| {row.description} | {verdict} | {ids} |"
        )
    out += ["", "Backported without an upstream fix to point at:", ""]
    out += [f"- `{patch}`: {why}" for patch, why in NO_UPSTREAM.items()]
    return "\n".join(out) + "\n"


def stubs(table: Sequence[Change]) -> str:
    """JSON entries for the unreviewed rows, ready to fill in and add to the verdicts file."""
    todo = [
        {
            "release": row.release,
            "verdict": "unreviewed",
            "description": row.description,
            "hunks": [list(h) for h in row.hunks],
        }
        for row in table
        if row.verdict == "unreviewed"
    ]
    return json.dumps(todo, indent=1)


def dump(hunks: Sequence[Hunk]) -> str:
    """Every hunk with its capability-12 lines, for reviewing."""
    out = []
    for hunk in hunks:
        moved = f" (moved from {hunk.old_file})" if hunk.old_file else ""
        found = f" [{', '.join(hunk.families)}]" if hunk.families else ""
        out.append(
            f"## {hunk.release} {hunk.file}{moved} #{hunk.id} "
            f"@@ -{hunk.old_start} +{hunk.new_start}{found}"
        )
        out.extend(f"    {line}" for line in hunk.lines)
        out.extend(f"    (gate) {line}" for line in hunk.gates)
    return "\n".join(out) + "\n"


class _Parser(argparse.ArgumentParser):
    """Usage errors in one line, as sglpatch's own: `prog: error: ... (see prog --help)`."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def release_name(value: str) -> str:
    """An argparse type: a published release, spelled as tests/support/releases.py spells it.

    Between the oldest and the newest release tests/support/releases.py lists every one, so a
    version in that span it lacks is no release; one past the newest is a new release, fetched
    with pip.
    """
    try:
        version = Version(value)
    except InvalidVersion:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a release (a version such as {LAST})"
        ) from None
    if version.local is not None:
        raise argparse.ArgumentTypeError(f"{value!r} is not a release: it has a local label")
    known = {Version(r): r for r in RELEASES}
    if version in known:
        return known[version]
    oldest, newest = min(known), max(known)
    if oldest < version < newest:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not a release: tests/support/wheels.py lists every release from "
            f"{known[oldest]} to {known[newest]}"
        )
    return str(version)


def _check_out(out: Path, writing: bool) -> None:
    """Refuse an --out that cannot be written, before the wheels are read and diffed."""
    where = f"--out {out}"
    if out.is_dir():
        raise TriageError(f"{where} is a folder; give the Markdown file to write")
    if not writing:
        return
    folder = out.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        raise TriageError(f"{where}: {folder} {what}")
    try:  # the one sure test: make (and drop) the kind of temporary file the write will make
        handle, probe = tempfile.mkstemp(dir=folder, prefix=f".{out.name}.", suffix=".tmp")
    except OSError as error:
        raise TriageError(f"{where}: cannot write in {folder}: {error.strerror}") from None
    os.close(handle)
    Path(probe).unlink()


def _parser() -> _Parser:
    parser = _Parser(prog=PROG, description=__doc__.split("\n")[0])
    parser.add_argument(
        "--from", dest="first", type=release_name, default=FIRST, help="oldest release"
    )
    parser.add_argument("--to", dest="last", type=release_name, default=LAST, help="newest release")
    parser.add_argument("--out", type=Path, default=DOC, help="the Markdown table to write")
    parser.add_argument("--verdicts", type=Path, default=VERDICTS, help="the verdicts file")
    parser.add_argument("--check", action="store_true", help="compare with --out, write nothing")
    parser.add_argument("--dump", action="store_true", help="print every hunk's lines")
    parser.add_argument("--stubs", action="store_true", help="print JSON for unreviewed rows")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return _run(args)
    except TriageError as error:
        print(f"{PROG}: error: {error}", file=sys.stderr)
        return error.code
    except KeyboardInterrupt:
        print(f"{PROG}: interrupted", file=sys.stderr)
        return 130


def _run(args: argparse.Namespace) -> int:
    # Every value is checked before the first wheel is read: nothing is written on a bad one.
    if Version(args.first) >= Version(args.last):
        raise TriageError(
            f"--from {args.first} is not older than --to {args.last}: "
            "the range selects no release to compare"
        )
    _check_out(args.out, writing=not (args.check or args.dump or args.stubs))
    changes = load_verdicts(args.verdicts)
    if problems := unknown_verdicts(changes):
        more = f"; and {len(problems) - 3} more" if len(problems) > 3 else ""
        shown = "; ".join(problems[:3]) + more
        raise TriageError(f"--verdicts {args.verdicts}: {len(problems)} problems: {shown}")
    hunks = collect(args.first, args.last)
    if args.dump:
        sys.stdout.write(dump(hunks))
        return 0
    table = rows(hunks, changes)
    if args.stubs:
        print(stubs(table))
        return 0
    text = render(table, hunks, args.first, args.last)
    unreviewed = sum(len(row.hunks) for row in table if row.verdict == "unreviewed")
    if args.check:
        try:
            stale = not args.out.exists() or args.out.read_bytes() != text.encode()
        except OSError as error:
            raise TriageError(f"--out {args.out}: cannot read it: {error.strerror}") from None
        if stale:
            print(f"{args.out} is not what the script generates", file=sys.stderr)
        if unreviewed:
            print(f"{unreviewed} hunks have no verdict", file=sys.stderr)
        return 1 if stale or unreviewed else 0
    try:
        write_output(args.out, text.encode())
    except OSError as error:
        raise TriageError(f"--out {args.out}: cannot write it: {error.strerror}", code=1) from None
    print(f"{args.out}: {len(table)} rows, {len(hunks)} hunks, {unreviewed} unreviewed")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
