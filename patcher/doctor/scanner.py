"""Capability gates in SGLang's whole tree: which files can hold one, and which lines.

A file is read as bytes and rejected by byte tests unless it names a capability word, a helper
or a dict row keyed 9/10; in the rest, the candidate lines (`candidates`) and the functions
around them (`chunks`) are parsed and judged by `gates`, and major-keyed tables by `tables`.
The files are shared with a forked worker process, so the scan uses both cores.
"""

from __future__ import annotations

import ast
import concurrent.futures
import multiprocessing
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from sglpatch.doctor import candidates, chunks, gates, tables
from sglpatch.doctor.findings import Finding
from sglpatch.doctor.source_tree import Source

# Quick byte tests before any parsing: a capability word, a helper, or a dict row keyed 9/10.
_ROW = re.compile(rb"(?:^|[{,])\s*(?:9|10)\s*:", re.MULTILINE)
_WORDS = (b"apabilit", b"APABILIT", b"is_sm", b"blackwell", b"get_device_sm")


def scan(source: Source, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    return Scan(source, helpers).result()


class Scan:
    """A scan of the whole tree, started in a forked worker while the caller does other work.

    The files go out in batches to one worker process; `result()` scans here every batch the
    worker has not started yet (a future not yet running can be cancelled), so both cores stay
    busy whatever the caller did meanwhile. Fork shares the loaded modules, so the worker costs
    milliseconds; without fork or a second core the scan runs here, in `result()`.
    """

    def __init__(self, source: Source, helpers: Mapping[str, frozenset[int]]) -> None:
        self.jobs = [
            (path, source.shown(path), helpers)
            for path in sorted(source.package_dir.rglob("*.py"))
            if not _is_test(path.relative_to(source.package_dir).parts)
        ]
        self.batches = [
            list(range(start, min(start + _BATCH, len(self.jobs))))
            for start in range(0, len(self.jobs), _BATCH)
        ]
        self.pool: concurrent.futures.ProcessPoolExecutor | None = None
        self.futures: list[concurrent.futures.Future[dict[int, list[Finding]]]] = []
        if _FORK is not None and (os.cpu_count() or 1) > 1 and len(self.batches) > 1:
            self.pool = concurrent.futures.ProcessPoolExecutor(1, mp_context=_FORK)
            self.futures = [
                self.pool.submit(_scan_many, [(i, self.jobs[i]) for i in batch])
                for batch in self.batches
            ]

    def result(self) -> list[Finding]:
        found: dict[int, list[Finding]] = {}
        if self.pool is None:
            found = _scan_many(list(enumerate(self.jobs)))
        else:
            with self.pool:
                # From the back: the worker takes batches from the front.
                for future, batch in reversed(list(zip(self.futures, self.batches, strict=True))):
                    if future.cancel():
                        found.update(_scan_many([(i, self.jobs[i]) for i in batch]))
                for future in self.futures:
                    if not future.cancelled():
                        found.update(future.result())
        return [finding for index in range(len(self.jobs)) for finding in found[index]]

    def close(self) -> None:
        """Drop the batches not started (after `result()`, there are none)."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)


_BATCH = 100
_Job = tuple[int, tuple[Path, str, Mapping[str, frozenset[int]]]]
_FORK = (
    multiprocessing.get_context("fork")
    if "fork" in multiprocessing.get_all_start_methods()
    else None
)


def _scan_many(jobs: Sequence[_Job]) -> dict[int, list[Finding]]:
    return {index: _scan_path(job) for index, job in jobs}


def _is_test(parts: tuple[str, ...]) -> bool:
    """SGLang ships its tests and benchmarks; they gate what they test, not what a server runs."""
    return any(p in ("test", "tests", "benchmark") for p in parts[:-1]) or parts[-1].startswith(
        "test_"
    )


def _scan_path(job: tuple[Path, str, Mapping[str, frozenset[int]]]) -> list[Finding]:
    path, shown, helpers = job
    try:
        data = path.read_bytes()
    except OSError:
        return []
    return scan_bytes(data, shown, helpers)


def scan_bytes(data: bytes, shown: str, helpers: Mapping[str, frozenset[int]]) -> list[Finding]:
    """The findings in one file's bytes; `shown` names it (`sglang/srt/...`)."""
    rows = (b"9:" in data or b"10:" in data) and _ROW.search(data) is not None
    if not rows and not any(word in data for word in _WORDS):
        return []
    text = data.decode("utf-8", errors="replace")
    starts = candidates.Starts(data)
    source_lines = text.splitlines()
    lines = candidates.with_aliases(
        text, data, starts, candidates.keyword_lines(data, starts, source_lines)
    )
    if not lines and not rows:
        return []
    # Tables need every read of their name, so a file with rows is parsed whole.
    parsed = None if rows else chunks.parse(source_lines, lines)
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


_DEFINED = re.compile(r"^\s*def\s+(is_\w+)", re.MULTILINE)
