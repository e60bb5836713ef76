"""The survey's three shortcuts change no outcome: one run answers for 12.0 and 12.1 where the
release never lets the minor decide (`both_parts`), a model's checkpoints share an outcome where
the release never read their quantization, and what is compiled is kept on disk between runs
(`disk_cache`). Each is held against the plain way, on real releases: every part run apart,
every checkpoint evaluated, nothing kept."""

from __future__ import annotations

import dataclasses
import functools
from pathlib import Path

import pytest

from sglpatch.doctor.resolve import Outcome, Resolver, disk_cache, lifting, sandbox, survey
from sglpatch.doctor.resolve.both_parts import BOTH, DIVERGED, PARTS, TwoMinors
from sglpatch.doctor.resolve.variants import Variant, variants
from tests.support.census import wheel_files

# Classes whose start-up reads the checkpoint's quantization (GPT-OSS, DeepSeek, Qwen3 MoE),
# one that refuses, and plain ones.
CLASSES = (
    "LlamaForCausalLM",
    "GptOssForCausalLM",
    "DeepseekV3ForCausalLM",
    "Qwen3MoeForCausalLM",
    "Qwen3NextForCausalLM",
    "Gemma2ForCausalLM",
    "Olmo2ForCausalLM",
    "Exaone4ForCausalLM",
    "KimiK25ForConditionalGeneration",
    "Glm4MoeForCausalLM",
)


def test_two_minors_carry_both_parts() -> None:
    DIVERGED.seen = False
    major, minor = BOTH
    sm = major * 10 + minor  # get_device_sm()
    assert isinstance(sm, TwoMinors) and (int.__int__(sm), sm.other) == (120, 121)
    DIVERGED.seen = False
    assert sm >= 100 and sm // 10 == 12 and sm != 90 and (major, 0) <= (12, 0)
    assert not DIVERGED.seen  # the same on both parts
    for differs in (
        lambda: sm == 120,
        lambda: sm >= 121,
        lambda: bool(minor),
        lambda: f"sm_{sm}",
        lambda: hash(minor),
        lambda: int(minor),
        lambda: minor.bit_length(),
        lambda: {121: "GB10"}.get(sm),
    ):
        DIVERGED.seen = False
        differs()
        assert DIVERGED.seen


@functools.cache
def _wanted(release: str) -> list[tuple[str, Variant]]:
    files = wheel_files(release)
    return [(arch, variant) for arch in CLASSES for variant in variants(files, arch)]


def _plain(release: str, part: str) -> list[Outcome]:
    """Every checkpoint evaluated on one part, no outcome shared."""
    resolver = Resolver(wheel_files(release), survey.capability(part))
    with survey.quiet(), resolver.sandbox.active():
        return [survey.evaluate(resolver, arch, v) for arch, v in _wanted(release)]


def _shared(outcome: Outcome) -> Outcome:
    return dataclasses.replace(outcome, quantization_unread=False)


@pytest.mark.wheel
@pytest.mark.parametrize(("release", "diverges"), [("0.5.9", True), ("0.5.23", False)])
def test_one_run_answers_as_each_part_apart(release: str, diverges: bool) -> None:
    # 0.5.9 reads the device's name (its H20 check): 12.1 is run on its own there.
    with survey.quiet():
        answers = survey.outcomes_at(wheel_files(release), dict.fromkeys(PARTS, _wanted(release)))
    assert DIVERGED.seen is diverges
    for part in PARTS:
        assert [_shared(o) for o in answers[part]] == [_shared(o) for o in _plain(release, part)]
    # Some checkpoints of one class differ, so sharing an outcome could have been wrong.
    by_class: dict[str, set[tuple[object, ...]]] = {}
    for (arch, _), outcome in zip(_wanted(release), answers["12.0"], strict=True):
        by_class.setdefault(arch, set()).add((outcome.choices, outcome.refused))
    assert any(len(found) > 1 for found in by_class.values())
    assert any(o.quantization_unread for o in answers["12.0"])


@pytest.mark.wheel
def test_a_warm_cache_parses_nothing(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path))
    files, wanted = wheel_files("0.5.23"), _wanted("0.5.23")[:12]
    _forget(monkeypatch)
    with survey.quiet():
        cold = survey.outcomes_at(files, {"12.0": wanted})
    lifting.keep_analyses()
    assert list((tmp_path / "compiled").iterdir())

    def no_parse(source: bytes) -> object:
        raise AssertionError("parsed a module the cache holds")

    _forget(monkeypatch)
    monkeypatch.setattr(lifting, "parsed", no_parse)
    with survey.quiet():
        assert survey.outcomes_at(files, {"12.0": wanted}) == cold


@pytest.mark.wheel
def test_damaged_or_unwritable_cache_is_a_miss(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    files, wanted = wheel_files("0.5.23"), _wanted("0.5.23")[:6]
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path))
    _forget(monkeypatch)
    with survey.quiet():
        expected = survey.outcomes_at(files, {"12.0": wanted})
    lifting.keep_analyses()
    entries = list((tmp_path / "compiled").iterdir())
    for n, entry in enumerate(entries):  # garbage, a truncated entry, a payload not its digest
        entry.write_bytes([b"\x00garbage", entry.read_bytes()[:40], bytes(32) + b"\xe9"][n % 3])
    _forget(monkeypatch)
    with survey.quiet():
        assert survey.outcomes_at(files, {"12.0": wanted}) == expected
    lifting.keep_analyses()  # each was a miss, compiled again and written whole
    assert all(disk_cache.load(entry.name) is not None for entry in entries)
    (tmp_path / "compiled").chmod(0o777)  # a folder others may write: nothing in it is run
    assert all(disk_cache.load(entry.name) is None for entry in entries)
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(blocked))  # its folder cannot be made
    _forget(monkeypatch)
    with survey.quiet():
        assert survey.outcomes_at(files, {"12.0": wanted}) == expected
    lifting.keep_analyses()
    assert disk_cache.load("missing") is None


def _forget(monkeypatch: pytest.MonkeyPatch) -> None:
    """This process's memory of compiled modules dropped: the next run reads the disk."""
    monkeypatch.setattr(lifting, "_ANALYSED", {})
    sandbox._compiled.cache_clear()
