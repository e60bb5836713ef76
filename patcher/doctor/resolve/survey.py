"""Every architecture asked about, in each of its variants, through the release's start-up
resolution on each capability: the work doctor hands a worker while it scans the tree.

The release's code logs, warns and sometimes prints while it resolves; all of that is kept out
of doctor's output (it is about stand-ins, not the user's machine).
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import logging
import os
import sys
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

from sglpatch.doctor.resolve.both_parts import BOTH, DIVERGED, PARTS
from sglpatch.doctor.resolve.files import ReleaseFiles, tree_files
from sglpatch.doctor.resolve.lifting import keep_analyses
from sglpatch.doctor.resolve.resolution import Outcome, Resolver
from sglpatch.doctor.resolve.stand_ins import Capability
from sglpatch.doctor.resolve.variants import Variant, variants

Key = tuple[str, str, str]  # (architecture, variant label, capability "12.0")
Wanted = Sequence[tuple[str, Variant]]  # (architecture, one of its variants)
REFERENCE = (10, 0)  # where a refusal is asked again: B200, which SGLang is built for


def capability(shown: str) -> tuple[int, int]:
    major, minor = shown.split(".")
    return int(major), int(minor)


def survey(
    package_dir: Path,
    capabilities: Sequence[str],
    architectures: Sequence[str],
    flags: Mapping[str, object] = {},
) -> tuple[dict[str, list[Variant]], dict[Key, Outcome]]:
    """For the SGLang at `package_dir`: each architecture's variants, and each one's outcome
    on each capability, launched with `flags` (a picklable answer, for a worker)."""
    files = tree_files(package_dir)
    forms = {arch: variants(files, arch) for arch in architectures}
    wanted = [(arch, variant) for arch, found in forms.items() for variant in found]
    with quiet():
        answers = outcomes_at(files, {shown: wanted for shown in capabilities}, flags)
        outcomes = {
            (arch, variant.label, shown): outcome
            for shown, found in answers.items()
            for (arch, variant), outcome in zip(wanted, found, strict=True)
        }
        _refused_on_reference(files, forms, outcomes, flags)
    keep_analyses()
    return forms, outcomes


def again_at(
    package_dir: Path,
    replaced: Mapping[str, bytes],
    asked: Mapping[str, Wanted],
    flags: Mapping[str, object] = {},
) -> dict[str, list[Outcome]]:
    """The variants `asked` on each part, of the SGLang at `package_dir` with some files
    replaced (a patch applied in memory); picklable arguments, for a worker."""
    with quiet():
        answers = outcomes_at(tree_files(package_dir), asked, flags, replaced)
    keep_analyses()
    return answers


def outcomes_at(
    files: ReleaseFiles,
    asked: Mapping[str, Wanted],
    flags: Mapping[str, object] = {},
    replaced: Mapping[str, bytes] = {},
) -> dict[str, list[Outcome]]:
    """Each part's outcomes for the variants asked on it. When 12.0 and 12.1 are both asked,
    one run answers for both unless the release lets the minor decide a step (`both_parts`)."""
    if set(asked) != set(PARTS):
        return {s: _run(files, capability(s), w, flags, replaced) for s, w in asked.items()}
    every = {(arch, v.label): (arch, v) for shown in PARTS for arch, v in asked[shown]}
    DIVERGED.seen = False
    both = dict(zip(every, _run(files, BOTH, list(every.values()), flags, replaced), strict=True))
    answers = {shown: [both[arch, v.label] for arch, v in asked[shown]] for shown in PARTS}
    if DIVERGED.seen:  # 12.0's answers stand (its path was followed); 12.1 is run on its own
        answers["12.1"] = _run(files, (12, 1), asked["12.1"], flags, replaced)
    return answers


def _run(
    files: ReleaseFiles,
    at: Capability,
    wanted: Wanted,
    flags: Mapping[str, object],
    replaced: Mapping[str, bytes],
) -> list[Outcome]:
    resolver = Resolver(files, at, replaced)
    found: list[Outcome] = []
    alike: dict[tuple[str, str], Outcome] = {}  # by model and fields (their values unhashable)
    with resolver.sandbox.active():  # served once for every model
        for arch, variant in wanted:
            fields = (arch, repr(variant.extra))
            outcome = alike.get(fields) or evaluate(resolver, arch, variant, flags)
            if outcome.quantization_unread:
                alike[fields] = outcome
            found.append(outcome)
    return found


def _refused_on_reference(
    files: ReleaseFiles,
    forms: Mapping[str, Sequence[Variant]],
    outcomes: dict[Key, Outcome],
    flags: Mapping[str, object],
) -> None:
    """Marks the refusals that the reference GPU gets too."""
    refused = {(k[0], k[1]) for k, outcome in outcomes.items() if outcome.refused}
    if not refused:
        return
    labels = {(arch, v.label): v for arch, found in forms.items() for v in found}
    wanted = [(arch, labels[arch, label]) for arch, label in sorted(refused)]
    there = dict(zip(sorted(refused), _run(files, REFERENCE, wanted, flags, {}), strict=True))
    for key, outcome in outcomes.items():
        if outcome.refused and there[key[0], key[1]].refused == outcome.refused:
            outcomes[key] = dataclasses.replace(outcome, refused_on_reference=True)


def evaluate(
    resolver: Resolver, arch: str, variant: Variant, flags: Mapping[str, object] = {}
) -> Outcome:
    """One checkpoint; whatever the tree does to the stand-ins (a file missing or broken, a
    module that fails as it is run), the answer is "not evaluated" and why, never an error."""
    try:
        return resolver.evaluate(arch, variant.checkpoint, dict(variant.extra), flags)
    except KeyboardInterrupt:
        raise
    except BaseException as error:  # the release's code on stand-ins: even a SystemExit
        return Outcome(not_evaluated=f"{type(error).__name__}: {str(error)[:200]}")


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """The release's logging, warnings and prints swallowed, and what it writes to file
    descriptors 1 and 2 too (`sys.__stdout__`, `os.write(1, ...)`): doctor's own output,
    `--json` above all, is doctor's alone."""
    sglang = logging.getLogger("sglang")
    level, propagate = sglang.level, sglang.propagate
    sglang.setLevel(logging.CRITICAL + 1)
    sglang.propagate = False
    sink = io.StringIO()
    try:
        with (
            _descriptors_silenced(),
            warnings.catch_warnings(),
            contextlib.redirect_stdout(sink),
            contextlib.redirect_stderr(sink),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        sglang.setLevel(level)
        sglang.propagate = propagate


@contextlib.contextmanager
def _descriptors_silenced() -> Iterator[None]:
    for stream in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):
        with contextlib.suppress(Exception):  # a closed or odd stream: nothing to flush
            if stream is not None:
                stream.flush()
    saved: list[tuple[int, int]] = []
    try:
        with Path(os.devnull).open("wb") as null:
            for fd in (1, 2):
                with contextlib.suppress(OSError):  # not open: nothing to keep out
                    saved.append((fd, os.dup(fd)))
                    os.dup2(null.fileno(), fd)
        yield
    finally:
        for fd, copy in saved:
            os.dup2(copy, fd)
            os.close(copy)
