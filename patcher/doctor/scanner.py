"""Capability gates in SGLang's whole tree: which files can hold one, and which lines.

A file is read as bytes and rejected by byte tests unless it names a capability word, a helper
or a dict row keyed 10; in the rest, the candidate lines (`candidates`) and the statements
around them (`chunks`) are parsed and judged by `gates`, and major-keyed tables by `tables`.
A forked worker process scans beside the caller, so the scan uses both cores.
"""

from __future__ import annotations

import ast
import contextlib
import mmap
import os
import pickle
import re
import signal
import subprocess
from collections.abc import Mapping
from typing import Any, BinaryIO, NoReturn

from sglpatch import warmup
from sglpatch.doctor import candidates, chunks, devices, gates, tables
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import TOO_DEEP, TOO_DEEP_WHY, Source, read_file
from sglpatch.warmup import usable_cores

# Quick byte tests before any parsing: a capability word, a helper, or a dict row keyed 10
# (`tables`). Each test is a search through every byte of the tree: they are few, and literal.
_WORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"device_sm")


def scan(source: Source, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    return Scan(source, helpers).result()


class Scan:
    """A scan of the whole tree, started in a forked worker while the caller does other work.

    The worker takes files from the front and `result()` from the back, one at a time, until
    they meet: both cores stay busy whatever the caller did meanwhile, and neither waits long
    for the other at the end. The worker sends back its findings only. Fork shares the loaded
    modules and the file list, so the worker costs milliseconds; without fork or a second
    core, or for a small tree, the scan runs here.
    """

    def __init__(self, source: Source, helpers: Mapping[str, frozenset[int]]) -> None:
        self.source = source
        self.helpers = helpers
        grep = _GitGrep(source)  # runs while the tree is listed here
        listed = _python_files(source)
        holding = grep.files()
        # git reads a symlink as its target's name, not its content, and skips what is not a
        # regular file: those are tested here (and the latter reported as not judged).
        self.jobs = [
            (path, shown)
            for path, shown, unusual in listed
            if holding is None or unusual or shown[len("sglang/") :] in holding
        ]
        # [next file from the front, first file taken from the back], shared with the worker.
        # No lock (a worker killed holding one would hang the caller): at worst both scan the
        # file where they meet.
        self.taken: Any = [0, len(self.jobs)]
        self.worker: int | None = None  # its pid
        self.results: BinaryIO | None = None
        if _FORK and usable_cores() > 1 and len(self.jobs) > _SMALL:
            with contextlib.suppress(OSError):  # no memory, pipe or process: scan here
                self._fork()

    def _fork(self) -> None:
        shared = mmap.mmap(-1, 8)  # anonymous, so shared across fork
        taken = memoryview(shared).cast("i")
        taken[0], taken[1] = 0, len(self.jobs)
        reader, writer = os.pipe()
        try:
            pid = os.fork()
        except OSError:
            os.close(reader)
            os.close(writer)
            raise
        if pid == 0:
            warmup.child_started()
            os.close(reader)
            self.taken = taken
            self._work(writer)  # never returns
        warmup.track(pid)
        os.close(writer)
        self.taken, self.worker = taken, pid  # the view keeps the mmap alive
        self.results = os.fdopen(reader, "rb")

    def result(self) -> list[Finding]:
        """The findings, in the files' order; files not judged are noted in the source."""
        found: dict[int, list[Finding]] = {}
        unjudged: dict[int, str] = {}
        taken = self.taken
        while (index := taken[1] - 1) >= taken[0]:
            taken[1] = index
            self._scan_into(index, found, unjudged)
        if self.results is not None:
            received = 0  # the worker has sent the findings of files [0, received)
            while True:
                try:
                    received, findings, not_judged, finished = pickle.load(self.results)
                except (EOFError, pickle.UnpicklingError):  # it died: scan here what it did not
                    for index in range(received, taken[1]):
                        self._scan_into(index, found, unjudged)
                    break
                found.update(findings)
                unjudged.update(not_judged)
                if finished:
                    break
            self.close()
        for index in sorted(unjudged):
            self.source.note(self.jobs[index][1], unjudged[index])
        return [finding for index in range(len(self.jobs)) for finding in found.get(index, ())]

    def close(self) -> None:
        """Stop the worker (after `result()`, it has finished)."""
        if self.worker is not None:
            with contextlib.suppress(OSError):  # gone already
                os.kill(self.worker, signal.SIGKILL)
            with contextlib.suppress(ChildProcessError):
                os.waitpid(self.worker, 0)
            warmup.untrack(self.worker)
            self.worker = None
        if self.results is not None:
            self.results.close()
            self.results = None

    def _work(self, writer: int) -> NoReturn:
        """The worker: files from the front, findings to `writer`, then the end of the process."""
        code = 1
        try:
            signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C, stops us
            with os.fdopen(writer, "wb") as sent:
                taken = self.taken
                found: dict[int, list[Finding]] = {}
                unjudged: dict[int, str] = {}
                while (index := taken[0]) < taken[1]:
                    taken[0] = index + 1
                    self._scan_into(index, found, unjudged)
                    if (index + 1) % _SEND_EVERY == 0:
                        pickle.dump((index + 1, found, unjudged, False), sent)
                        sent.flush()
                        found, unjudged = {}, {}
                pickle.dump((taken[0], found, unjudged, True), sent)
            code = 0
        finally:
            os._exit(code)  # not the caller's atexit handlers, nor its buffered output

    def _scan_into(
        self, index: int, found: dict[int, list[Finding]], unjudged: dict[int, str]
    ) -> None:
        """Scan file `index`; keep its findings, if it has any, or why it was not judged.

        os calls, not open() (a file object costs more than rejecting most files): a stat, then
        a non-blocking open of a regular file only (a FIFO named `x.py` must not hang doctor).
        """
        path, shown = self.jobs[index]
        data, why = read_file(path)
        if data is None:
            if why is not None:
                unjudged[index] = why
            return
        try:
            findings = scan_bytes(data, shown, self.helpers)
        except TOO_DEEP:
            unjudged[index] = TOO_DEEP_WHY
            return
        if findings:
            found[index] = findings


_SMALL = 100  # files: fewer are scanned faster than a process starts
_SEND_EVERY = 256  # files the worker scans between two sends of its findings


_FORK = hasattr(os, "fork")


class _GitGrep:
    """The `.py` files (relative to the package) that hold a word of the byte tests, found by
    `git grep`: it looks for them all in one pass, on every core, where Python makes a pass per
    word. git is there already (the ledger needs it); when it cannot say (not installed, or
    failing), `files()` is None and every file is tested here."""

    def __init__(self, source: Source) -> None:
        self.root = source.package_dir
        needles = [arg for word in (*_WORDS, _ROW_KEY) for arg in ("-e", word.decode())]
        skipped = [f":(exclude,glob)**/{folder}/**" for folder in _NOT_SERVED]
        self.process: subprocess.Popen[bytes] | None = None
        with contextlib.suppress(OSError):  # no git: files() says None
            self.process = subprocess.Popen(
                ["git", "grep", "--no-index", "--no-full-name", "--no-color", "-a", "-l", "-z",
                 "-F", *needles, "--", "*.py", *skipped],
                cwd=source.package_dir,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env={**os.environ, "GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull},
            )  # fmt: skip
        if self.process is not None:
            warmup.track(self.process.pid)

    def files(self) -> set[str] | None:
        if self.process is None:
            return None
        output, _ = self.process.communicate()
        warmup.untrack(self.process.pid)
        if self.process.returncode not in (0, 1):  # 1: no file matched
            return None
        names = {os.fsdecode(name) for name in output.split(b"\0") if name}
        # Paths relative to the package, or git said something else (a config that names
        # files from a repository's top, say): then git's answer is not used at all.
        if not all((self.root / name).is_file() for name in names):
            return None
        return names


def _python_files(source: Source) -> list[tuple[str, str, bool]]:
    """(path, shown, a symlink or not a regular file) of the tree's `.py` files in the order of
    sorted Paths, tests and benchmarks left out. Plain strings from os.scandir, entries sorted by
    name as they are met (which is that order): a Path per file costs more than the byte tests.
    The entry's type comes with the listing: telling them apart costs no call."""
    found: list[tuple[str, str, bool]] = []

    def visit(folder: str, shown: str) -> None:
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in _NOT_SERVED:
                    visit(entry.path, f"{shown}{entry.name}/")
            elif entry.name.endswith(".py") and not entry.name.startswith("test_"):
                unusual = entry.is_symlink() or not entry.is_file(follow_symlinks=False)
                found.append((entry.path, shown + entry.name, unusual))

    visit(str(source.package_dir), "sglang/")
    return found


# SGLang ships its tests and benchmarks: they gate what they test, not what a server runs.
_NOT_SERVED = ("test", "tests", "benchmark")


def scan_bytes(data: bytes, shown: str, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    """The findings in one file's bytes; `shown` names it (`sglang/srt/...`)."""
    rows = _has_row(data)
    if not rows and not any(word in data for word in _WORDS):
        return []
    text = data.decode("utf-8", errors="replace")
    starts = candidates.Starts(data)
    source_lines = text.splitlines()
    lines = candidates.with_aliases(
        source_lines, data, starts, candidates.keyword_lines(data, starts, source_lines)
    )
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
    defined = frozenset(_DEFINED.findall(text)) if "def is_" in text else frozenset()
    found = list(gates.Gates(tree, shown, scanned, helpers, defined).run(wanted)) if wanted else []
    found = [f._replace(line=real[f.line]) for f in found]
    if rows:
        found += tables.tables(tree, shown, source_lines)
    return sorted(set(found), key=lambda f: (f.line, f.kind))


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
_DEFINED = re.compile(r"^\s*def\s+(is_\w+)", re.MULTILINE)


def _new_helpers(helpers: Mapping[str, frozenset[int]]) -> list[str]:
    """The helpers true on capability 12 alone (`is_sm120_supported`)."""
    return [name for name, majors in helpers.items() if majors == {devices.NEW}]
