"""Parsing only what a patch reads (`sglpatch.elision`): the cut, the splice, and the engine's
fallback to the whole file wherever the part cannot answer for it."""

from __future__ import annotations

import pytest
from packaging.version import Version

from sglpatch import elision, engine
from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AnchorMissing,
    ByRelease,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)
from sglpatch.results import Applied, Failed

RELEASE = Version("0.5.9")

SOURCE = b'''\
"""A module shaped like SGLang's passes."""
from __future__ import annotations

import torch


def first(x):
    return x


# the pass doctor cares about
def wanted(args):
    if torch.cuda.get_device_capability()[0] == 10:
        args.backend = "trtllm"
    return args


@decorated
def other(args):
    """Left out."""
    return [
        args,
    ]

CONSTANT = {"a": 1}


class Holder:
    field: int = 0

    def kept(self):
        return 1

    async def dropped(self):
        return 2
        # a trailing comment of the method


def last():
    pass
'''


def test_left_out_definitions_become_placeholders_at_their_place() -> None:
    cut = elision.elide(SOURCE, {"wanted", "Holder.kept"})
    assert cut is not None
    text = cut.text.decode()
    # `first` opens the file's first block (libcst's indentation comes from it): kept.
    assert "def first(x):\n    return x" in text
    assert "def wanted(args):" in text and "def kept(self):" in text
    for gone in ("def other", "async def dropped", "def last", "Left out"):
        assert gone not in text
    # Imports, assignments, class fields and comments outside the definitions stay.
    for kept in ("import torch", 'CONSTANT = {"a": 1}', "field: int = 0", "# the pass doctor"):
        assert kept in text
    assert "# a trailing comment of the method" in text
    assert [p for p, _ in cut.held] == [
        b"_sglpatch_elided_0\n",
        b"    _sglpatch_elided_1\n",
        b"_sglpatch_elided_2\n",
    ]
    assert cut.held[0][1].startswith(b"@decorated\ndef other")
    assert elision.splice(cut, cut.text) == SOURCE


def test_a_patched_part_splices_to_what_the_whole_file_gives() -> None:
    patch = _Retarget()
    whole, _ = engine.transform_module(engine.parse(SOURCE), SOURCE, "m.py", [patch], RELEASE)  # type: ignore[arg-type]
    part, outcomes = engine.transform_source(SOURCE, "m.py", [patch], RELEASE)
    assert isinstance(engine.parse_for(SOURCE, [patch], RELEASE), engine.Parsed)
    assert engine.parse_for(SOURCE, [patch], RELEASE).cut is not None  # type: ignore[union-attr]
    assert whole is not None and part is not None
    assert part.after == whole.after
    assert b'args.backend = "triton"' in part.after
    assert outcomes == {patch.id: Applied(patch.id, "m.py")}


def test_crlf_files_keep_their_line_endings() -> None:
    crlf = SOURCE.replace(b"\n", b"\r\n")
    cut = elision.elide(crlf, {"wanted"})
    assert cut is not None and cut.held[0][0] == b"_sglpatch_elided_0\r\n"
    assert elision.splice(cut, cut.text) == crlf
    patch = _Retarget()
    whole, _ = engine.transform_module(engine.parse(crlf), crlf, "m.py", [patch], RELEASE)  # type: ignore[arg-type]
    part, _ = engine.transform_source(crlf, "m.py", [patch], RELEASE)
    assert whole is not None and part is not None and part.after == whole.after


@pytest.mark.parametrize(
    "source",
    [
        b"# -*- coding: latin-1 -*-\n" + SOURCE,  # ast and libcst would disagree on offsets
        b"\xef\xbb\xbf" + SOURCE,
        SOURCE + b"_sglpatch_elided_0 = 1\n",  # the placeholders' own prefix
        SOURCE + b"def broken(:\n",  # a syntax error: the whole parse reports it
    ],
    ids=["coding", "bom", "prefix", "syntax-error"],
)
def test_what_cannot_be_cut_safely_is_parsed_whole(source: bytes) -> None:
    assert elision.elide(source, {"wanted"}) is None


def test_nothing_to_leave_out_is_parsed_whole() -> None:
    every = {"first", "wanted", "other", "Holder", "last"}
    assert elision.elide(SOURCE, every) is None


@pytest.mark.parametrize(
    "edit",
    [
        lambda text: text.replace(b"_sglpatch_elided_1\n", b""),  # dropped
        lambda text: text + b"_sglpatch_elided_2\n",  # copied
        lambda text: text.replace(b"    _sglpatch_elided_1", b"        _sglpatch_elided_1"),
    ],
    ids=["dropped", "copied", "re-indented"],
)
def test_a_placeholder_moved_copied_or_dropped_gives_no_splice(edit: object) -> None:
    cut = elision.elide(SOURCE, {"wanted", "Holder.kept"})
    assert cut is not None
    assert elision.splice(cut, edit(cut.text)) is None  # type: ignore[operator]


def test_a_patch_that_reads_past_its_declaration_gets_the_whole_files_answer() -> None:
    """`reads` names `wanted`, but the patch also needs `other`: in the part it finds no
    anchor, so the engine runs it again over the whole file, whose answer stands."""
    patch = _ReadsTooLittle()
    change, outcomes = engine.transform_source(SOURCE, "m.py", [patch], RELEASE)
    assert outcomes == {patch.id: Applied(patch.id, "m.py")}
    assert change is not None and b"# seen by sglpatch" in change.after
    parsed = engine.parse_for(SOURCE, [patch], RELEASE)
    assert isinstance(parsed, engine.Parsed) and parsed.cut is not None
    outcome, after, parsed = engine.run_alone(parsed, "m.py", patch, RELEASE)
    assert outcome == Applied(patch.id, "m.py") and after == change.after
    assert isinstance(parsed, engine.Parsed) and parsed.cut is None  # whole from here on


def test_a_patch_that_fails_on_the_whole_file_too_fails() -> None:
    patch = _ReadsTooLittle()
    source = SOURCE.replace(b"def other", b"def renamed")
    _, outcomes = engine.transform_source(source, "m.py", [patch], RELEASE)
    assert isinstance(outcomes[patch.id], Failed)


def test_one_patch_without_reads_parses_the_file_whole() -> None:
    whole = _ReadsTooLittle()
    whole_reads = type("WholeFile", (_ReadsTooLittle,), {"id": "whole-file", "reads": None})()
    assert isinstance(engine.parse_for(SOURCE, [whole], RELEASE), engine.Parsed)
    parsed = engine.parse_for(SOURCE, [whole, whole_reads], RELEASE)
    assert isinstance(parsed, engine.Parsed) and parsed.cut is None


class _Retarget(Patch):
    id = "retarget"
    description = symptom = "test"
    tested = TESTED
    files = ByRelease({">=0": "m.py"})
    reads = ("wanted",)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        function = cst_tools.find_function(module, "wanted")
        for string in cst_tools.walk(function, cst.SimpleString):
            if string.value == '"trtllm"':
                return cst_tools.replace(module, string, string.with_changes(value='"triton"'))
        raise AlreadyPresent("done")

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if '"triton"' not in module.code_for_node(cst_tools.find_function(module, "wanted")):
            raise PostconditionFailed("not retargeted")


class _ReadsTooLittle(Patch):
    id = "reads-too-little"
    description = symptom = "test"
    tested = TESTED
    files = ByRelease({">=0": "m.py"})
    reads: tuple[str, ...] | None = ("wanted",)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        other = [
            s for s in module.body if isinstance(s, cst.FunctionDef) and s.name.value == "other"
        ]
        if not other:
            raise AnchorMissing("no function other")
        if module.code_for_node(other[0]).startswith("# seen"):
            raise AlreadyPresent("seen")
        marked = other[0].with_changes(
            leading_lines=[cst.EmptyLine(comment=cst.Comment("# seen by sglpatch"))]
        )
        return cst_tools.replace(module, other[0], marked)

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if "# seen by sglpatch" not in module.code:
            raise PostconditionFailed("not marked")
