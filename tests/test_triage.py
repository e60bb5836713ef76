"""scripts/sm120_triage.py: what it matches, how it keeps verdicts, and the committed table."""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import wheels
from tests.support.releases import SEED, UPGRADE

DOC = wheels.REPO / "docs" / "sm120-upstream.md"
VERDICTS = wheels.REPO / "docs" / "sm120-verdicts.json"
# The lead's backport ids: each must stand on the upstream change it backports.
ASSIGNED = {
    "sm120-extend-attention-blocks": SEED,
    "sm120-deep-gemm-off": "0.5.13",
    "sm120-fp8-block-gemm-triton": UPGRADE,
    "sm120-mxfp4-moe-backend": UPGRADE,
    "sm120-hybrid-gdn-backend": "0.5.16",
    "sm120-triton-kernels-mxfp4-block-k": UPGRADE,
}
# Small, pure-Python wheels whose diffs hold two backported upstream fixes.
FIRST, LAST = "0.5.8.post1", UPGRADE


triage = importlib.import_module("scripts.sm120_triage")
triage_diff = importlib.import_module("scripts.triage.diff")  # where the wheels are read


def _table(text: str) -> list[list[str]]:
    """The table's body rows, split into cells."""
    lines = [line for line in text.splitlines() if line.startswith("| ")][1:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in lines]


@pytest.mark.parametrize(
    "line",
    [
        "if is_sm120_supported():",
        "self.is_xqa_impl = get_platform().is_sm90 or get_platform().is_sm120",
        "if _is_cuda and CUDA_CAPABILITY[0] == 12:",
        "if sm_version == 120:",
        "if sm_version in (120, 121) and not available():",
        "return torch.cuda.get_device_capability()[0] in [10, 12]",
        "and 90 <= _device_sm < 120",
        "elif major == 12 and minor == 1:",
        "if arch.major * 10 + arch.minor >= 120:",
        "{CapabilityRequirement.cuda(min_sm=(12, 0), max_sm=(12, 9))}",
        "# sm_121 (GB10 / DGX Spark) caps shared memory at 99 KB per block",
        "# Target: RTX PRO 6000 (SM120, 188 SMs, 99KB SMEM)",
        'nvcc_flags = ["-arch=sm_120a"]',
        'assert page_table is None, "Paged KV not supported on SM 12.0"',
    ],
)
def test_lines_that_name_capability_12_match(line: str) -> None:
    assert triage.mentions_capability_12(line)


@pytest.mark.parametrize(
    "line",
    [
        "assert self.num_warps == 12 or self.num_warps == 16",
        "if CUDA_VERSION.major == 12 and CUDA_VERSION.minor == 9:",
        "if cuda_version >= (12, 0) and sm_version >= 90:",
        '"flow_shift": 12.0,',
        "skey = tl.sort((ids << 12) | offs)",
        "if len(msg) > 12 and len(msg[12]) > 0:",
        "if head_num == 12 and kv_cache_dtype == fp8_dtype:",
        "if is_sm100_supported() or is_blackwell_supported():",
        "self.num_regs_per_thread = 168 if self.num_warps == 12 else 128",
    ],
)
def test_lines_about_other_twelves_do_not(line: str) -> None:
    assert not triage.mentions_capability_12(line)


def _hunk(release: str, file: str, hunk: str) -> object:
    return triage.Hunk(release, "0.5.23", file, None, hunk, 1, 1, ("+if is_sm120_supported():",))


def test_a_rerun_keeps_old_verdicts_and_marks_new_hunks_unreviewed() -> None:
    reviewed = triage.Change(
        "0.5.23", "new-feature", "known", hunks=[("sglang/a.py", "aaaa"), ("sglang/b.py", "bbbb")]
    )
    hunks = [
        _hunk("0.5.23", "sglang/a.py", "aaaa"),
        _hunk("0.5.23", "sglang/b.py", "bbbb"),
        _hunk("0.5.24", "sglang/a.py", "cccc"),  # the new release's change
        _hunk("0.5.24", "sglang/a.py", "dddd"),
    ]
    rows = triage.rows(hunks, [reviewed])
    assert [(r.release, r.verdict, r.hunks) for r in rows] == [
        ("0.5.23", "new-feature", [("sglang/a.py", "aaaa"), ("sglang/b.py", "bbbb")]),
        ("0.5.24", "unreviewed", [("sglang/a.py", "cccc"), ("sglang/a.py", "dddd")]),
    ]
    stub = json.loads(triage.stubs(rows))
    assert stub == [
        {
            "release": "0.5.24",
            "verdict": "unreviewed",
            "description": "`+if is_sm120_supported():`",
            "hunks": [["sglang/a.py", "cccc"], ["sglang/a.py", "dddd"]],
        }
    ]


def test_a_verdict_file_with_unknown_or_incomplete_verdicts_is_refused(tmp_path: Path) -> None:
    bad = tmp_path / "verdicts.json"
    bad.write_text(
        json.dumps(
            [
                {"release": SEED, "verdict": "maybe", "description": "x", "hunks": []},
                {"release": SEED, "verdict": "backported", "description": "y", "hunks": []},
            ]
        )
    )
    assert triage.main(["--verdicts", str(bad), "--out", str(tmp_path / "o.md")]) == 2
    assert not (tmp_path / "o.md").exists()


def test_every_row_of_the_committed_table_has_a_verdict() -> None:
    table = _table(DOC.read_text())
    assert len(table) > 50
    allowed = set(triage.VERDICT_TEXT.values()) - {"unreviewed"}
    reviewed = {
        (c.release, file, hunk) for c in triage.load_verdicts(VERDICTS) for file, hunk in c.hunks
    }
    for release, _files, description, verdict, hunks in table:
        assert description and verdict.split(" (`")[0] in allowed, (release, description)
        if verdict.startswith("backported"):
            assert verdict.endswith("`)"), (release, description)
        for hunk in hunks.split():
            hunk = hunk.strip("`")
            assert any(r == release and h == hunk for r, _, h in reviewed), (release, hunk)
    assert triage.unknown_verdicts(triage.load_verdicts(VERDICTS)) == []


def test_the_assigned_backports_stand_on_their_upstream_release() -> None:
    rows = {(r[0], r[3]) for r in _table(DOC.read_text())}
    for patch, release in ASSIGNED.items():
        assert (release, f"backported (`{patch}`)") in rows, patch
    assert (
        "0.5.21",
        "backported (`sm120-deep-gemm-off`)",
    ) in rows  # 12.1 follows eight releases later
    assert "sm120-prefill-attention-block" in DOC.read_text()  # no upstream row: a note


@pytest.mark.wheel
def test_a_small_range_of_real_wheels_regenerates_the_committed_rows(tmp_path: Path) -> None:
    here, there = tmp_path / "here.md", tmp_path / "there.md"
    assert triage.main(["--from", FIRST, "--to", LAST, "--out", str(here)]) == 0
    # The same run in a fresh interpreter with another hash seed: nothing depends on set order.
    # (Run as the module, from the root: scripts/__init__.py.)
    subprocess.run(
        [sys.executable, "-m", "scripts.sm120_triage", "--from", FIRST, "--to", LAST, "--out",
         str(there)],
        check=True,
        env={**os.environ, "PYTHONHASHSEED": "7"},
        capture_output=True,
        cwd=wheels.REPO,
    )  # fmt: skip
    assert here.read_bytes() == there.read_bytes()
    fresh = _table(here.read_text())
    committed = [row for row in _table(DOC.read_text()) if row[0] in {SEED, UPGRADE}]
    assert fresh == committed
    assert {row[3] for row in fresh} >= {
        "backported (`sm120-extend-attention-blocks`)",
        "backported (`sm120-fp8-block-gemm-triton`)",
    }
    assert not any(row[3] == "unreviewed" for row in fresh)


# --- gates that include capability 12 without naming it (issue 19) -----------------------------

# Functions far enough apart (8 blank lines) to fall in hunks of their own.
OLD_GATE = """\
def pick_backend(server_args):
    if is_sm100_supported():
        backend = "trtllm_mla"
    else:
        backend = "flashinfer"
    return backend


def use_fp4():
    if major == 9:
        return False
    return True


def blackwell_moe():
    if is_blackwell():
        return "flashinfer_cutlass"
    return "triton"


def blackwell_attention():
    return "triton"
"""
# `else` after `is_sm100` changed (12 took it); `major >= 10` new; `is_blackwell()` next to trtllm.
NEW_GATE = """\
def pick_backend(server_args):
    if is_sm100_supported():
        backend = "trtllm_mla"
    else:
        backend = "triton"
    return backend


def use_fp4():
    if major >= 10:
        return False
    return True


def blackwell_moe():
    if is_blackwell():
        return "flashinfer_cutlass_v2"
    return "triton"


def blackwell_attention():
    if is_blackwell():
        return "trtllm_mha"
    return "triton"
"""


OLD_GATE, NEW_GATE = (("\n" * 8 + "def ").join(t.split("\n\n\ndef ")) for t in (OLD_GATE, NEW_GATE))


def _fake_releases(monkeypatch: pytest.MonkeyPatch, old: str, new: str) -> None:
    files = {"0.5.23": old, "0.5.24": new}
    monkeypatch.setattr(
        triage_diff, "_sources", lambda release: {"sglang/srt/x.py": files[release].encode()}
    )


def test_gates_that_let_12_in_without_naming_it_are_listed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _fake_releases(monkeypatch, OLD_GATE, NEW_GATE)
    hunks = triage.diff_releases("0.5.23", "0.5.24")
    found = {line: hunk.families for hunk in hunks for line in hunk.lines}
    assert found == {
        '-backend = "flashinfer"': ("branch",),  # the `else` after `is_sm100`
        '+backend = "triton"': ("branch",),
        "-if major == 9:": ("capability-10",),
        "+if major >= 10:": ("capability-10",),
        "+if is_blackwell():": ("blackwell", "branch"),  # next to trtllm_mha, and its body
        '+return "trtllm_mha"': ("blackwell", "branch"),
    }
    # `is_blackwell()` with no SM100-only name in its hunk (blackwell_moe) is not listed.
    assert all("flashinfer_cutlass" not in line for hunk in hunks for line in hunk.lines)
    assert all("names-12" not in hunk.families for hunk in hunks)


@pytest.mark.parametrize(
    ("line", "families"),
    [
        ("if is_blackwell_supported() and use_trtllm:", {"blackwell"}),
        ("elif get_platform().is_blackwell:", {"blackwell"}),
        ("if is_sm100_supported() or is_sm90_supported():", {"sm100-sm90"}),
        ("if major >= 10:", {"capability-10"}),
        ("if torch.cuda.get_device_capability()[0] >= 10:", {"capability-10"}),
        ("if get_device_sm() >= 100:", {"capability-10"}),
        ("if device_sm >= 100 and self.use_mla:", {"capability-10"}),
        ("if sm_version >= 100:", {"capability-10"}),
        ("if get_device_sm() not in (100, 103):", {"capability-10"}),
        ("if capability >= (10, 0):", {"capability-10"}),
        ("# is_blackwell() is true on 12 too", set()),  # a comment is no gate
        ("if _device_sm < 80:", set()),  # a bound below 8 says nothing about 12
        ("assert 0 <= self.minor < 10", set()),
        ("if CUDA_VERSION.major >= 10:", set()),
        ("num_warps = 8 if head_dim >= 128 else 4", set()),
    ],
)
def test_each_gate_family_matches_its_lines(line: str, families: set[str]) -> None:
    assert triage.gate_families(line) == families


def test_a_body_line_or_else_belongs_to_the_gate_above_it() -> None:
    lines = NEW_GATE.splitlines()
    condition = triage.branch_conditions
    assert "is_sm100_supported" in condition(lines, lines.index('        backend = "triton"'))
    assert "is_sm100_supported" in condition(lines, lines.index("    else:"))
    assert condition(lines, lines.index("    return backend")) == ""  # after the chain


def _gate_hunk(hunk: str) -> object:
    return triage.Hunk(
        "0.5.24", "0.5.23", "sglang/srt/x.py", None, hunk, 1, 1, ("+if major >= 10:",),
        families=("capability-10",),
    )  # fmt: skip


def test_a_verdict_file_missing_a_hunk_fails_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    hunks = [_gate_hunk("aaaa"), _gate_hunk("bbbb")]
    monkeypatch.setattr(triage, "collect", lambda first, last: hunks)
    out, verdicts = tmp_path / "out.md", tmp_path / "verdicts.json"
    change = {"release": "0.5.24", "verdict": "excluded", "description": "x"}
    verdicts.write_text(json.dumps([{**change, "hunks": [["sglang/srt/x.py", "aaaa"]]}]))
    args = ["--from", "0.5.23", "--to", "0.5.24", "--out", str(out), "--verdicts", str(verdicts)]
    assert triage.main(args) == 0  # writes the table, one row unreviewed
    assert triage.main([*args, "--check"]) == 1
    assert "1 hunks have no verdict" in capsys.readouterr().err
    both = [["sglang/srt/x.py", "aaaa"], ["sglang/srt/x.py", "bbbb"]]
    verdicts.write_text(json.dumps([{**change, "hunks": both}]))
    assert triage.main(args) == 0
    assert triage.main([*args, "--check"]) == 0
    assert "not a gap: 12 excluded before and after" in out.read_text()


def test_the_counts_in_the_doc_match_its_rows_and_the_verdicts() -> None:
    text = DOC.read_text()
    table = _table(text)
    summary = next(line for line in text.splitlines() if line.startswith("Rows: "))
    by_text = {words: key for key, words in triage.VERDICT_TEXT.items()}
    rows: dict[str, int] = {}
    hunks: dict[str, int] = {}
    for _release, _files, _description, verdict, ids in table:
        key = by_text[verdict.split(" (`")[0]]
        rows[key] = rows.get(key, 0) + 1
        hunks[key] = hunks.get(key, 0) + len(ids.split())
    said_rows = ", ".join(
        f"{triage.VERDICT_TEXT[k]} {rows[k]}" for k in triage.VERDICT_TEXT if k in rows
    )
    said_hunks = ", ".join(
        f"{triage.VERDICT_TEXT[k]} {hunks[k]}" for k in triage.VERDICT_TEXT if k in hunks
    )
    assert summary.startswith(f"Rows: {said_rows}. Hunks: {sum(hunks.values())} ({said_hunks}).")
    # Every hunk of the verdicts file is in the table, under its own verdict, once.
    changes = triage.load_verdicts(VERDICTS)
    from_file: dict[str, int] = {}
    for change in changes:
        from_file[change.verdict] = from_file.get(change.verdict, 0) + len(change.hunks)
    assert from_file == hunks
    assert "unreviewed" not in rows
