"""Parsing only what a patch reads (`sglpatch.elision`): the cut, the splice, and the engine's
fallback to the whole file wherever the part cannot answer for it."""

from __future__ import annotations

import gc
from pathlib import Path
from unittest.mock import ANY

import pytest
from packaging.version import Version

from sglpatch import collector, elision, engine
from sglpatch.doctor import coverage
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
from sglpatch.target import find_target
from tests.support.releases import SEED

RELEASE = Version(SEED)

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
    # The comment after `dropped`, as deep as its body, is its block's footer: it goes with it.
    assert "# a trailing comment of the method" not in text
    assert cut.held[1][1].endswith(b"        # a trailing comment of the method\n")
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
        b"# -*- coding: latin-1 -*-\n" + SOURCE,  # the placeholders are UTF-8
        b"\xef\xbb\xbf" + SOURCE,
        SOURCE + b"_sglpatch_elided_0 = 1\n",  # the placeholders' own prefix
        SOURCE + b"def broken(:\n",  # a syntax error: the whole parse reports it
        SOURCE + b"\n\ndef continued():\n    x = 1 \\\n\n",  # its last line goes on
        SOURCE + b"\n\ndef tabbed():\n    pass\n\t# a tab: how deep libcst counts it?\n",
    ],
    ids=["coding", "bom", "prefix", "syntax-error", "backslash", "tab-after"],
)
def test_what_cannot_be_cut_safely_is_parsed_whole(source: bytes) -> None:
    assert elision.elide(source, {"wanted"}) is None


def test_a_utf8_coding_comment_is_no_reason_to_parse_whole() -> None:
    source = b"# -*- coding: utf-8 -*-\n" + SOURCE
    cut = elision.elide(source, {"wanted"})
    assert cut is not None and elision.splice(cut, cut.text) == source


def test_a_body_continued_by_a_backslash_is_no_block_of_its_own() -> None:
    """`def first(): \\` + `  return 0` is one logical line: libcst's indentation comes from the
    next block, which is kept."""
    source = b"def first(): \\\n  return 0\ndef f():\n\treturn 1\ndef g():\n    return 2\n"
    assert elision.elide(source, {"g"}) is None  # f holds the first indented block


FIRST = "def first():\n    pass\n\n\n"
# (reads, how the patch edits, the file): code inserted beside a placeholder, where libcst gives
# the lines after a block (up to the last one as deep as its body) to that block's footer.
BESIDE = {
    "class-last-method-comment": (
        ("A.m",),
        "append-method",
        "class A:\n    def m(self):\n        return 1\n\n    def n(self):\n        return 2\n"
        "        # end of n\n\n\nx = 1\n",
    ),
    "function-comment-before-next": (
        ("g",),
        "before-g",
        FIRST + "def f():\n    return 1\n    # f's trailing comment\n\n\ndef g():\n    return 2\n",
    ),
    "last-function-comment": (
        ("g",),
        "append",
        FIRST + "def g():\n    return 2\n\n\ndef f():\n    return 1\n    # end\n",
    ),
    "nested-class-comment": (
        ("g",),
        "before-g",
        FIRST + "class C:\n    class D:\n        def x(self):\n            pass\n    # c\n\n\n"
        "def g():\n    return 2\n",
    ),
    "whitespace-only-lines": (
        ("g",),
        "before-g",
        FIRST + "def f():\n    return 1\n    \n        \ndef g():\n    return 2\n",
    ),
    "shallow-then-deep-comment": (
        ("g",),
        "before-g",
        FIRST + "def f():\n    return 1\n  # shallow\n    # deep\n# top\ndef g():\n    return 2\n",
    ),
}


@pytest.mark.parametrize("case", list(BESIDE))
def test_code_inserted_beside_a_placeholder_lands_where_it_would_in_the_whole_file(
    case: str,
) -> None:
    reads, edit, text = BESIDE[case]
    source = text.encode()
    patch = _inserting(reads, edit)
    parsed = engine.parse_for(source, [patch], RELEASE)
    assert isinstance(parsed, engine.Parsed) and parsed.cut is not None  # the part is used
    whole, whole_outcomes = engine.transform_module(
        engine.parse(source),  # type: ignore[arg-type]
        source,
        "m.py",
        [patch],
        RELEASE,
    )
    part, outcomes = engine.transform_source(source, "m.py", [patch], RELEASE)  # apply's way
    assert outcomes == whole_outcomes
    assert part is not None and whole is not None and part.after == whole.after
    _, after, _ = engine.run_alone(parsed, "m.py", patch, RELEASE)  # doctor's way
    assert after == whole.after


def _inserting(reads: tuple[str, ...], edit: str) -> Patch:
    """A patch adding `sglpatch_marker` at a boundary: the end of class A, before g, the end."""

    class Inserting(Patch):
        id = "inserting"
        description = symptom = "test"
        tested = TESTED
        files = ByRelease({">=0": "m.py"})

        def transform(self, module: cst.Module, release: Version) -> cst.Module:
            if "sglpatch_marker" in module.code:
                raise AlreadyPresent("there")
            new = cst.parse_statement(
                "def sglpatch_marker(self):\n    return 3\n", config=module.config_for_parsing
            )
            if edit == "append-method":
                owner = cst_tools.find_class(module, "A")
                body = owner.body.with_changes(body=[*owner.body.body, new])
                return cst_tools.replace(module, owner, owner.with_changes(body=body))
            body = list(module.body)
            at = len(body)
            if edit == "before-g":
                at = next(
                    i
                    for i, s in enumerate(body)
                    if isinstance(s, cst.FunctionDef) and s.name.value == "g"
                )
            return module.with_changes(body=[*body[:at], new, *body[at:]])

        def postcondition(self, module: cst.Module, release: Version) -> None:
            if "sglpatch_marker" not in module.code:
                raise PostconditionFailed("not added")

    Inserting.reads = reads
    return Inserting()


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


def test_the_engine_plans_with_the_collector_paused(tmp_path: Path) -> None:
    """Its trees hold no cycles: no collector pass while they are built, and it is back on
    after (nested, only the outermost resumes it)."""
    seen: list[bool] = []

    class Seeing(_Retarget):
        def transform(self, module: cst.Module, release: Version) -> cst.Module:
            seen.append(gc.isenabled())
            return super().transform(module, release)

    (tmp_path / "sglang" / "srt").mkdir(parents=True)
    (tmp_path / "sglang" / "__init__.py").write_text("")
    (tmp_path / "sglang" / "m.py").write_bytes(SOURCE)
    target = find_target(tmp_path / "sglang", RELEASE)
    assert gc.isenabled()
    plan = engine.plan(target, [Seeing()], RELEASE)
    assert [o.state for o in plan.outcomes] == ["applied"] and seen and not any(seen)
    assert gc.isenabled()
    with collector.paused():
        engine.plan(target, [Seeing()], RELEASE)
        assert not gc.isenabled()  # the engine's pause ended; the outer one holds
    assert gc.isenabled()


def test_a_plugins_patch_in_the_catalogue_has_doctor_parse_every_file_whole() -> None:
    """Its code runs under doctor's time limit, file by file: nothing is parsed for it in part."""
    plugin = _Retarget()
    plugin.origin = "my-plugin"
    assert coverage._by_file([_Retarget(), plugin], RELEASE) == {}
    assert coverage._by_file([_Retarget()], RELEASE) == {"m.py": [ANY]}


def test_settling_leaves_what_the_caller_froze_frozen() -> None:
    """doctor settles its report out of the collector's way; `gc.unfreeze` would also hand back
    everything the caller froze (this session's shared trees: seconds per later full pass)."""
    gc.freeze()
    frozen = gc.get_freeze_count()
    assert frozen > 0
    with collector.paused(settle=True):
        kept = [[] for _ in range(1000)]
    assert gc.get_freeze_count() >= frozen and kept
