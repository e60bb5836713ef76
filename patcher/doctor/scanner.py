"""Capability gates in SGLang's whole tree: which files can hold one, and which lines.

A file is read as bytes and rejected by byte tests unless it names a capability word, a helper
or a dict row keyed 10; in the rest, the candidate lines (`candidates`) and the statements
around them (`chunks`) are parsed and judged by `gates`, and major-keyed tables by `tables`.
A forked worker process scans beside the caller, so the scan uses both cores.
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import re
import signal
from collections.abc import Mapping
from multiprocessing.connection import Connection
from typing import Any

from sglpatch.doctor import candidates, chunks, devices, gates, tables
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import Source

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
        self.helpers = helpers
        self.jobs = _python_files(source)
        # No lock on the counters (a worker killed holding one would hang the caller): at worst
        # both scan the file where they meet.
        self.front: Any = _Counter(0)
        self.back: Any = _Counter(len(self.jobs))
        self.worker: Any = None  # multiprocessing's process type is private to its context
        self.results: Connection | None = None
        if _FORK is not None and (os.cpu_count() or 1) > 1 and len(self.jobs) > _SMALL:
            self.front = _FORK.RawValue("i", 0)
            self.back = _FORK.RawValue("i", len(self.jobs))
            self.results, sent = _FORK.Pipe(duplex=False)
            self.worker = _FORK.Process(target=self._work, args=(sent,), daemon=True)
            self.worker.start()
            sent.close()

    def result(self) -> list[Finding]:
        found: dict[int, list[Finding]] = {}
        while (index := self.back.value - 1) >= self.front.value:
            self.back.value = index
            self._scan_into(index, found)
        if self.results is not None:
            received = 0  # the worker has sent the findings of files [0, received)
            while True:
                try:
                    received, findings, finished = self.results.recv()
                except EOFError:  # the worker died: scan here what it did not send
                    for index in range(received, self.back.value):
                        self._scan_into(index, found)
                    break
                found.update(findings)
                if finished:
                    break
            self.close()
        return [finding for index in range(len(self.jobs)) for finding in found.get(index, ())]

    def close(self) -> None:
        """Stop the worker (after `result()`, it has finished)."""
        if self.worker is not None:
            self.worker.terminate()
            self.worker.join()
            self.worker = None
        if self.results is not None:
            self.results.close()
            self.results = None

    def _work(self, sent: Connection) -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # the caller handles Ctrl-C and stops us
        found: dict[int, list[Finding]] = {}
        while (index := self.front.value) < self.back.value:
            self.front.value = index + 1
            self._scan_into(index, found)
            if (index + 1) % _SEND_EVERY == 0:
                sent.send((index + 1, found, False))
                found = {}
        sent.send((self.front.value, found, True))

    def _scan_into(self, index: int, found: dict[int, list[Finding]]) -> None:
        """Scan file `index`; keep its findings, if it has any."""
        path, shown = self.jobs[index]
        try:
            with open(path, "rb") as file:  # noqa: PTH123 (see _python_files)
                data = file.read()
        except OSError:
            return
        if findings := scan_bytes(data, shown, self.helpers):
            found[index] = findings


_SMALL = 100  # files: fewer are scanned faster than a process starts
_SEND_EVERY = 256  # files the worker scans between two sends of its findings


class _Counter:
    """A file counter for a scan without a worker: `.value`, like multiprocessing's."""

    def __init__(self, value: int) -> None:
        self.value = value


_FORK = (
    multiprocessing.get_context("fork")
    if "fork" in multiprocessing.get_all_start_methods()
    else None
)


def _python_files(source: Source) -> list[tuple[str, str]]:
    """(path, shown) of the tree's `.py` files in the order of sorted Paths, tests and
    benchmarks left out. Plain strings from os.scandir, entries sorted by name as they are met
    (which is that order): a Path per file costs more than the byte tests that reject most."""
    found: list[tuple[str, str]] = []

    def visit(folder: str, shown: str) -> None:
        try:
            with os.scandir(folder) as listing:
                entries = sorted(listing, key=lambda entry: entry.name)
        except OSError:
            return
        for entry in entries:
            if entry.is_dir(follow_symlinks=False):
                if entry.name not in ("test", "tests", "benchmark"):
                    visit(entry.path, f"{shown}{entry.name}/")
            elif entry.name.endswith(".py") and not entry.name.startswith("test_"):
                found.append((entry.path, shown + entry.name))

    visit(str(source.package_dir), "sglang/")
    return found


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


def _has_row(data: bytes) -> bool:
    """A dict row keyed 10: `10:` after `{`, `,` or at a line's start, spaces between."""
    index = data.find(b"10:")
    while index != -1:
        before = index - 1
        while before >= 0 and data[before] in _BLANK:
            before -= 1
        if before < 0 or data[before] in _ROW_START or b"\n" in data[before:index]:
            return True
        index = data.find(b"10:", index + 3)
    return False


_BLANK = frozenset(b" \t\r\n\f\v")
_ROW_START = frozenset(b"{,")
_DEFINED = re.compile(r"^\s*def\s+(is_\w+)", re.MULTILINE)


def _new_helpers(helpers: Mapping[str, frozenset[int]]) -> list[str]:
    """The helpers true on capability 12 alone (`is_sm120_supported`)."""
    return [name for name, majors in helpers.items() if majors == {devices.NEW}]
