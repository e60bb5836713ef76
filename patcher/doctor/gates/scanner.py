"""Capability gates in SGLang's whole tree: which files can hold one, and which lines.

A file is read as bytes and rejected by byte tests unless it names a capability word, a helper
or a dict row keyed 10; in the rest, the candidate lines (`candidates`) and the statements
around them (`chunks`) are parsed and judged by `reach`, and major-keyed tables by `tables`.
The files are scanned in chunks, by the pool's workers and by the caller (`pool`).
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import os
import re
import subprocess
from collections.abc import Collection, Iterator, Sequence

from sglpatch.doctor.findings import Finding
from sglpatch.doctor.gates import devices, reach, tables
from sglpatch.doctor.read import candidates, chunks
from sglpatch.doctor.read.pool import Pool, Task
from sglpatch.doctor.read.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source, read_file

# Quick byte tests before any parsing: a capability word, a helper, or a dict row keyed 10
# (`tables`). Each test is a search through every byte of the tree: they are few, and literal.
_WORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"device_sm")

Helpers = devices.Helpers
Hits = tuple[tuple[int, bytes], ...]  # the lines git grep found in a file: (number, line)
Job = tuple[str, str, Hits | None]  # path, shown, its hits (None: not known, read it all)
# A chunk's findings (by the file's index in the scan) and the files it could not judge (why).
Found = tuple[dict[int, list[Finding]], dict[int, str]]


def scan(source: Source, helpers: Helpers) -> list[Finding]:
    """The whole tree, scanned here."""
    whole = Scan(source, helpers)
    whole.start()
    return whole.result()


class Scan:
    """A scan of the whole tree: `git grep` runs while the tree is listed, `start()` hands the
    files to `workers` in chunks (run here, by `result()`, when the pool is not open), and
    `result()` collects the chunks' findings in the files' order.
    """

    def __init__(self, source: Source, helpers: Helpers, workers: Pool | None = None) -> None:
        self.source = source
        self.helpers = helpers
        self.workers = workers or Pool()  # never started: every chunk runs here
        self._grep = _GitGrep(source, self.workers)  # runs while the tree is listed here
        self._listing = _python_files(source)
        self._listed: list[tuple[str, str, bool]] = []
        self.jobs: list[Job] = []
        self.tasks: list[Task[Found]] = []

    @property
    def listed(self) -> list[tuple[str, str, bool]]:
        """(path, shown, a symlink or not a regular file) of the tree's `.py` files."""
        self._listed.extend(self._listing)
        return self._listed

    def listed_up_to(self, count: int) -> int:
        """The `.py` files in the tree, counted up to `count`: whether to open the pool is known
        before the rest are listed (by `start()`, while the pool's first task runs)."""
        self._listed.extend(itertools.islice(self._listing, max(0, count - len(self._listed))))
        return len(self._listed)

    def start(self) -> None:
        listed = self.listed  # while git grep runs
        regular = {shown[len("sglang/") :] for _, shown, unusual in listed if not unusual}
        holding = self._grep.files(regular)
        # git reads a symlink as its target's name, not its content, and skips what is not a
        # regular file: those are tested here (and the latter reported as not judged).
        self.jobs = []
        for path, shown, unusual in listed:
            if holding is None or unusual:
                self.jobs.append((path, shown, None))  # read and tested whole
            elif (hits := holding.get(shown[len("sglang/") :])) is not None:
                self.jobs.append((path, shown, tuple(hits)))
        self.tasks = [
            self.workers.run(scan_files, self.jobs[first:end], first, self.helpers)
            for first, end in _chunks(len(self.jobs), self.workers.size)
        ]

    def result(self) -> list[Finding]:
        """The findings, in the files' order; files not judged are noted in the source."""
        found: dict[int, list[Finding]] = {}
        unjudged: dict[int, str] = {}
        for task in self.tasks:
            findings, not_judged = task.result()
            found.update(findings)
            unjudged.update(not_judged)
        for index in sorted(unjudged):
            self.source.note(self.jobs[index][1], unjudged[index])
        return [finding for index in range(len(self.jobs)) for finding in found.get(index, ())]


def _chunks(files: int, workers: int) -> list[tuple[int, int]]:
    """[first, end) of each task: one for the caller alone; for workers, large ones first (few
    hand-overs while the caller, busy with its own part, holds the GIL the pool's threads need)
    and smaller ones at the end, so that the workers finish together."""
    if workers == 0:
        return [(0, files)]
    found = []
    first = 0
    while first < files:
        end = min(files, first + max(_FEWEST, (files - first) // (3 * workers)))
        found.append((first, end))
        first = end
    return found


_FEWEST = 4  # files in the last tasks


def scan_files(jobs: Sequence[Job], first: int, helpers: Helpers) -> Found:
    """Scan files (path, shown, hits), the first of them the scan's file `first`: the findings
    of those that have any, and why those not judged could not be. A file whose hits show that
    it holds nothing to judge is not read.

    A non-blocking open of a regular file only (`read_file`): a FIFO named `x.py` must not hang
    doctor.
    """
    found: dict[int, list[Finding]] = {}
    unjudged: dict[int, str] = {}
    for index, (path, shown, hits) in enumerate(jobs, first):
        keyword = None if hits is None else _planned(hits)
        if hits is not None and keyword is None:
            continue
        data, why = read_file(path)
        if data is None:
            if why is not None:
                unjudged[index] = why
            continue
        try:
            findings = scan_bytes(data, shown, helpers, keyword)
        except TOO_DEEP:
            unjudged[index] = TOO_DEEP_WHY
            continue
        if findings:
            found[index] = findings
    return found, unjudged


def _planned(hits: Hits) -> list[int] | None:
    """The keyword lines of a file (`candidates.keyword_lines`) from its hits; None where
    `scan_bytes` would find nothing: no capability word and no table row, or neither a
    keyword line nor a row."""
    rows = any(_has_row(line) for _, line in hits if _ROW_KEY in line)
    if not rows and not any(word in line for _, line in hits for word in _WORDS):
        return None
    lines = candidates.hit_lines(hits)
    return lines if lines or rows else None


class _GitGrep:
    """The lines of the `.py` files (relative to the package) that hold a word of the byte
    tests, a keyword of `candidates` or a row's key, found by `git grep`: it looks for them all
    in one pass, where Python makes a pass per word. git is there already (the
    ledger needs it); when it cannot say (not installed, or failing), `files()` is None and
    every file is tested here. git skips a file or folder it cannot read with a warning and
    exit 0: a word from it on stderr is a failure too, or those files would be taken for files
    without hits."""

    def __init__(self, source: Source, workers: Pool | None = None) -> None:
        self.root = source.package_dir
        self.workers = workers or Pool()
        words = dict.fromkeys((*_WORDS, *candidates.KEYWORDS, _ROW_KEY))
        needles = [arg for word in words for arg in ("-e", word.decode())]
        skipped = [f":(exclude,glob)**/{folder}/**" for folder in _NOT_SERVED]
        self.process: subprocess.Popen[bytes] | None = None
        with contextlib.suppress(OSError):  # no git: files() says None
            self.process = subprocess.Popen(
                # One thread: its other threads cost more CPU than they save, and the CPU
                # is what doctor's processes share meanwhile.
                # --no-column: a repository's grep.column would add a field to each line.
                ["git", "grep", "--no-index", "--no-full-name", "--no-color", "--no-column", "-a",
                 "-n", "-z", "--threads=1", "-F", *needles, "--", "*.py", *skipped],
                cwd=source.package_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
            )  # fmt: skip
        if self.process is not None:
            self.workers.track(self.process)

    def files(self, regular: Collection[str] = ()) -> dict[str, list[tuple[int, bytes]]] | None:
        """name -> the lines found in it (number, line), in order. `regular`: names known to be
        regular files of the package already (the listing's), not looked up again."""
        if self.process is None:
            return None
        output, complaint = self.process.communicate()
        self.workers.untrack(self.process)
        if self.process.returncode not in (0, 1) or complaint:  # 1: no file matched
            return None
        found: dict[str, list[tuple[int, bytes]]] = {}
        try:
            for record in output.split(b"\n"):  # name NUL number NUL line (with -z and -n)
                if record:
                    name, number, line = record.split(b"\0", 2)
                    found.setdefault(os.fsdecode(name), []).append((int(number), line))
        except ValueError:  # a name with a newline in it: not git's answer to trust
            return None
        # Paths relative to the package, or git said something else (a config that names
        # files from a repository's top, say): then git's answer is not used at all.
        if not all(name in regular or (self.root / name).is_file() for name in found):
            return None
        return found


def _python_files(source: Source) -> Iterator[tuple[str, str, bool]]:
    """(path, shown, a symlink or not a regular file) of the tree's `.py` files in the order of
    sorted Paths, tests and benchmarks left out. Plain strings from os.scandir, entries sorted by
    name as they are met (which is that order): a Path per file costs more than the byte tests.
    The entry's type comes with the listing: telling them apart costs no call. A folder's
    entries are taken up where they were left once its subfolder is done (pre-order). A folder
    that cannot be listed is noted in the source, as not judged (git grep skips it too)."""
    folders = [_entries(source, str(source.package_dir), "sglang/")]
    while folders:
        for entry, shown in folders[-1]:
            try:
                is_folder = entry.is_dir(follow_symlinks=False)
            except OSError:  # no type in the listing, and no right to look: read whole
                is_folder = False
            if is_folder:
                if entry.name not in _NOT_SERVED:
                    folders.append(_entries(source, entry.path, f"{shown}{entry.name}/"))
                    break
            elif entry.name.endswith(".py") and not entry.name.startswith("test_"):
                yield entry.path, shown + entry.name, _unusual(entry)
        else:
            folders.pop()


def _entries(source: Source, folder: str, shown: str) -> Iterator[tuple[os.DirEntry[str], str]]:
    try:
        with os.scandir(folder) as listing:
            entries = sorted(listing, key=lambda entry: entry.name)
    except (FileNotFoundError, NotADirectoryError):  # gone since its folder was listed
        return iter(())
    except OSError as error:
        source.note_folder(folder, error)
        return iter(())
    return ((entry, shown) for entry in entries)


def _unusual(entry: os.DirEntry[str]) -> bool:
    """A symlink or not a regular file: read and tested whole (`read_file` says what it is)."""
    try:
        return entry.is_symlink() or not entry.is_file(follow_symlinks=False)
    except OSError:
        return True


# SGLang ships its tests and benchmarks: they gate what they test, not what a server runs.
# `__pycache__` holds no source (and may be a root-only 0700 folder left by a umask-077 run).
_NOT_SERVED = ("test", "tests", "benchmark", "__pycache__")


def scan_bytes(
    data: bytes, shown: str, helpers: Helpers, keyword: list[int] | None = None
) -> list[Finding]:
    """The findings in one file's bytes; `shown` names it (`sglang/srt/...`). `keyword`: its
    keyword lines when known already (`_planned`)."""
    rows = _has_row(data)
    if keyword is None and not rows and not any(word in data for word in _WORDS):
        return []
    text = data.decode("utf-8", errors="replace")
    starts = candidates.Starts(data)
    source_lines = lines_of(text)
    if keyword is None:
        keyword = candidates.keyword_lines(data, starts, source_lines)
    lines = candidates.with_aliases(source_lines, data, starts, keyword)
    if not lines and not rows:
        return []
    # Tables need every read of their name, so a file with rows is parsed whole.
    parsed = None
    if not rows:
        naming_new = candidates.naming_new(data, starts, _new_helpers(helpers))
        parsed = chunks.parse(source_lines, lines, naming_new)
    if parsed is not None:
        tree, scanned, wanted, real = parsed.tree, parsed.lines, parsed.wanted(lines), parsed.real
    else:
        try:
            tree = ast.parse(data, filename=shown)
        except (SyntaxError, ValueError):
            return []
        scanned, wanted, real = source_lines, lines, list(range(len(source_lines) + 1))
    # A module's own `def is_blackwell()` is not SGLang's helper of that name.
    defined = _defined(text) if "def is_" in text else frozenset()
    found = list(reach.Gates(tree, shown, scanned, helpers, defined).run(wanted)) if wanted else []
    found = [f._replace(line=real[f.line], head=real[f.head] if f.head else 0) for f in found]
    if rows:
        found += tables.tables(tree, shown, source_lines)
    return sorted(set(found), key=lambda f: (f.line, f.kind))


def lines_of(text: str) -> list[str]:
    """A module's lines as its bytes number them, by "\\n" (git grep's, and `Starts`'): not
    `str.splitlines`, which also breaks at a form feed or U+2028 that ast reads inside a line."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    if "\r" in text:
        lines = [line[:-1] if line.endswith("\r") else line for line in lines]
    return lines


def could_decide(data: bytes) -> bool:
    """Whether a file's bytes pass the byte tests: `scan_bytes` finds nothing in one that fails."""
    return _has_row(data) or any(word in data for word in _WORDS)


_ROW_KEY = b"10:"


def _has_row(data: bytes) -> bool:
    """A dict row keyed 10: `10:` after `{`, `,` or at a line's start, spaces between."""
    index = data.find(_ROW_KEY)
    while index != -1:
        before = index - 1
        while before >= 0 and data[before] in _BLANK:
            before -= 1
        if before < 0 or data[before] in _ROW_START or b"\n" in data[before:index]:
            return True
        index = data.find(_ROW_KEY, index + len(_ROW_KEY))
    return False


_BLANK = frozenset(b" \t\r\n\f\v")
_ROW_START = frozenset(b"{,")
_DEFINED = re.compile(r"def\s+(is_\w+)")


def _defined(text: str) -> frozenset[str]:
    """The `is_...` functions a module defines: `^\\s*def\\s+(is_\\w+)` (multiline), found where
    the text holds `def`, which the regex engine skips ahead to (a pattern led by `^` is tried at
    every offset, several times slower), and kept where only whitespace leads to it."""
    names = set()
    for match in _DEFINED.finditer(text):
        at = match.start()
        line = text.rfind("\n", 0, at) + 1
        if line == at or text[line:at].isspace():
            names.add(match.group(1))
    return frozenset(names)


def _new_helpers(helpers: Helpers) -> list[str]:
    """The helpers true on capability 12 alone (`is_sm120_supported`)."""
    return [name for name, majors in helpers.items() if devices.only_new(majors)]
