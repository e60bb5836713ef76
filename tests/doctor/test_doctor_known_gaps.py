"""Known gaps: what breaks on 12 where doctor's gate reading cannot see it, and no patch fixes.

The DSA indexer calls DeepGEMM with no capability gate, so before the known gaps doctor called a
DSA model "ready" on 0.5.9 - 0.5.21 after apply; that gap is now closed by patches (the indexer's
calls and the DSA backend's schedule take torch code on 12), which the trees are checked for
here, and a real release's doctor counts those patches before apply and nothing after. Each
remaining gap's range is checked against the trees.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.doctor import known_gaps
from sglpatch.doctor.known_gaps import GAPS, KnownGap
from sglpatch.errors import ExitCode
from sglpatch.patches.sm120_dsa_backend_torch_schedule import TARGET as BACKEND_SCHEDULE
from sglpatch.patches.sm120_dsa_indexer_fallback import TARGET as INDEXER_FALLBACK
from sglpatch.patches.sm120_dsa_indexer_torch_logits import TARGET as INDEXER_TORCH
from tests.support import wheels
from tests.support.releases import SEED

NVFP4_NOTE = next(g for g in GAPS if g.id == "nvfp4-moe-cutlass-gb10")
V32, V3 = "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"
INDEXERS = ("srt/layers/attention/nsa/nsa_indexer.py", "srt/layers/attention/dsa/dsa_indexer.py")
# DeepGEMM's logits, read off the module (to 0.5.21) or handed out by dsa/utils.py (0.5.22+)
DEEP_GEMM_LOGITS = re.compile(
    rb"deep_gemm\.fp8_(?:paged_)?mqa_logits\b|resolve_fp8_(?:paged_)?mqa_logits_fn\("
)
# A gap of the shape the DSA indexer's was: some classes always reach it, others `when`.
SAMPLE = KnownGap(
    "sample",
    "dies",
    SpecifierSet(">=0.5.9,<0.5.22"),
    ("12.0", "12.1"),
    "a patch",
    "a report",
    always=frozenset({V32}),
    maybe=frozenset({V3}),
    when="if the checkpoint says so",
)


def test_a_class_that_always_reaches_a_gap_blocks_a_shared_class_is_conditional(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(known_gaps, "GAPS", (SAMPLE,))
    both = ("12.0", "12.1")
    on = Version(SEED)
    assert known_gaps.known(on, {V32}, both).blockers == (SAMPLE,)
    assert known_gaps.known(on, {V3}, both).conditional == (SAMPLE,)
    assert known_gaps.known(on, {"LlamaForCausalLM"}, both) == known_gaps.Known()
    assert known_gaps.known(on, None, both).notes == (SAMPLE,)  # no model: said, not counted
    assert known_gaps.known(Version("0.5.22"), {V32}, both) == known_gaps.Known()
    assert known_gaps.known(None, {V32}, both) == known_gaps.Known()


def test_no_gap_is_left_for_a_dsa_model_on_12() -> None:
    both = ("12.0", "12.1")
    for release in ("0.5.9", "0.5.21", "0.5.22"):
        found = known_gaps.known(Version(release), {V32}, both)
        assert found.blockers == found.conditional == ()
        assert {g.id for g in found.notes} <= {NVFP4_NOTE.id}  # said of every model on 12.1


def test_the_gb10_nvfp4_note_is_said_on_12_1_only_and_never_counted() -> None:
    release = Version("0.5.23")
    assert known_gaps.known(release, {"Qwen3MoeForCausalLM"}, ("12.1",)).notes == (NVFP4_NOTE,)
    assert known_gaps.known(release, {"Qwen3MoeForCausalLM"}, ("12.0",)) == known_gaps.Known()
    blocking, maybe, notes = known_gaps.rows(release, {"Qwen3MoeForCausalLM"}, ("12.1",))
    assert blocking == maybe == [] and [n.source for n in notes] == [NVFP4_NOTE.id]
    assert Path(__file__).parents[2].joinpath(NVFP4_NOTE.sources).is_file()


def test_the_mixed_fp8_experts_note_is_said_of_a_read_mixed_checkpoint_alone() -> None:
    """Too narrow to say of every model: only where the checkpoint is read as modelopt_mixed."""
    mixed = next(g for g in GAPS if g.id == "modelopt-mixed-fp8-experts-cutlass")
    release, moe = Version("0.5.23"), {"Qwen3MoeForCausalLM"}
    assert mixed in known_gaps.known(release, moe, ("12.0",), "modelopt_mixed").notes
    for quantization in (None, "modelopt_fp4", "fp8"):
        assert mixed not in known_gaps.known(release, moe, ("12.0",), quantization).notes
    assert mixed not in known_gaps.known(release, None, ("12.0", "12.1")).notes


@pytest.mark.wheel
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_the_minimax_gap_holds_where_its_nvfp4_override_goes_blackwell_only(release: str) -> None:
    gap = next(g for g in GAPS if g.id == "minimax-m3-nvfp4-blackwell-only")
    override = "sglang/srt/arg_groups/model_overrides/minimax_m3.py"
    source = wheels.member(release, override) if override in wheels.members(release) else b""
    branch = b'quant_resolved == "minimax_m3_nvfp4"' in source and b"is_blackwell" in source
    megamoe = b'moe_a2a_backend="megamoe"' in source and b'"deep_gemm"' in source
    assert (Version(release) in gap.releases) == (branch and megamoe)
    assert known_gaps.known(Version("0.5.23"), set(gap.maybe), ("12.0",)).conditional == (gap,)


@pytest.mark.wheel
@pytest.mark.parametrize("release", wheels.RELEASES)
def test_where_the_indexer_calls_deep_gemm_a_patch_takes_it_off(release: str) -> None:
    """From the trees: on every release where DSA runs on CUDA (0.5.9+) and the indexer calls
    DeepGEMM's logits, a patch takes capability 12 off them: the release's own torch path from
    0.5.22, the backported one (indexer and backend) before."""
    version = Version(release)
    members = set(wheels.members(release))
    indexers = [f"sglang/{p}" for p in INDEXERS if f"sglang/{p}" in members]
    calls = any(DEEP_GEMM_LOGITS.search(wheels.member(release, m)) for m in indexers)
    dsa_on_cuda = version >= Version("0.5.9")  # before, nothing chooses DSA on CUDA
    own_path = INDEXER_FALLBACK.get(version) is not None
    backported = INDEXER_TORCH.get(version) is not None
    assert backported == (BACKEND_SCHEDULE.get(version) is not None)
    assert not (own_path and backported)
    assert (dsa_on_cuda and calls) == (own_path or backported)
    for member in indexers if backported else ():
        source = wheels.member(release, member).decode()
        # no gate of the release's own: what the patch adds is the only way off DeepGEMM
        assert "get_device_capability" not in source and "SGLANG_FP8_PAGED_MQA" not in source


@pytest.mark.wheel
def test_doctor_counts_the_indexer_patches_on_0_5_9_and_nothing_after_apply(
    tmp_path: Path,
) -> None:
    site = wheels.full_tree(SEED, tmp_path / "site")
    runner = CliRunner()

    def doctor(*args: str) -> tuple[int, dict[str, object]]:
        result = runner.invoke(app, ["doctor", "--target", str(site), "--json", *args])
        return result.exit_code, json.loads(result.stdout)

    code, report = doctor("--model", V32)
    assert code != 0 and not report["ready"]
    blockers = {b["source"]: b["fixed_by"] for b in report["blockers"]}  # type: ignore[attr-defined]
    for patch in ("sm120-dsa-indexer-torch-logits", "sm120-dsa-backend-torch-schedule"):
        assert blockers[patch] == patch
    api.apply(site, None, tmp_path / "ledger")
    code, report = doctor("--model", V32)
    assert code == ExitCode.OK and report["ready"] and report["known"] == []
    code, report = doctor("--model", V3)  # DeepSeek-V3 shares the class
    assert code == ExitCode.OK and report["ready"] and report["opt_in"] == []
    code, report = doctor()
    assert code == ExitCode.OK and report["known"] == []
