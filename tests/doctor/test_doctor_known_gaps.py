"""Known gaps: what breaks on 12 where doctor's gate reading cannot see it, and no patch fixes.

The DSA indexer calls DeepGEMM with no capability gate, so before this list doctor called a DSA
model "ready" on 0.5.9 - 0.5.21 after apply. Each gap's ranges are checked against the trees
(and the patch that closes it), and a real release's doctor answers with it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.doctor import known_gaps
from sglpatch.doctor.known_gaps import ALWAYS_DSA, GAPS
from sglpatch.errors import ExitCode
from sglpatch.patches.sm120_dsa_backends import DSA_ARCHITECTURES
from sglpatch.patches.sm120_dsa_indexer_fallback import TARGET as INDEXER_FALLBACK
from tests.support import wheels
from tests.support.releases import SEED

DSA_GAP = next(g for g in GAPS if g.id == "dsa-indexer-deep-gemm")
NVFP4_NOTE = next(g for g in GAPS if g.id == "nvfp4-moe-cutlass-gb10")
V32, V3 = "DeepseekV32ForCausalLM", "DeepseekV3ForCausalLM"
INDEXERS = ("srt/layers/attention/nsa/nsa_indexer.py", "srt/layers/attention/dsa/dsa_indexer.py")
DEEP_GEMM_LOGITS = re.compile(rb"deep_gemm\.fp8_(?:paged_)?mqa_logits\(")


def test_a_dsa_class_blocks_a_shared_class_is_conditional_others_are_untouched() -> None:
    both = ("12.0", "12.1")
    on = Version(SEED)
    assert known_gaps.known(on, {V32}, both).blockers == (DSA_GAP,)
    assert known_gaps.known(on, {V3}, both).conditional == (DSA_GAP,)
    assert known_gaps.known(on, {"LlamaForCausalLM"}, both) == known_gaps.Known()
    assert known_gaps.known(on, None, both).notes == (DSA_GAP,)  # no model: said, not counted
    assert known_gaps.known(Version("0.5.22"), {V32}, both).blockers == ()  # a patch there
    assert known_gaps.known(Version("0.5.8"), {V32}, both) == known_gaps.Known()  # no DSA
    assert known_gaps.known(None, {V32}, both) == known_gaps.Known()
    assert set(DSA_ARCHITECTURES) >= ALWAYS_DSA


def test_the_gb10_nvfp4_note_is_said_on_12_1_only_and_never_counted() -> None:
    release = Version("0.5.23")
    assert known_gaps.known(release, {"Qwen3MoeForCausalLM"}, ("12.1",)).notes == (NVFP4_NOTE,)
    assert known_gaps.known(release, {"Qwen3MoeForCausalLM"}, ("12.0",)) == known_gaps.Known()
    blocking, maybe, notes = known_gaps.rows(release, {"Qwen3MoeForCausalLM"}, ("12.1",))
    assert blocking == maybe == [] and [n.source for n in notes] == [NVFP4_NOTE.id]
    assert Path(__file__).parents[2].joinpath(NVFP4_NOTE.sources).is_file()


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
def test_the_dsa_gap_holds_where_the_indexer_calls_deep_gemm_and_no_patch_takes_it_off(
    release: str,
) -> None:
    """From the trees: the indexer's logits calls are DeepGEMM's with no capability gate in
    the gap's range; from 0.5.22 `sm120-dsa-indexer-fallback` gives 12 the torch path."""
    version = Version(release)
    members = set(wheels.members(release))
    indexers = [f"sglang/{p}" for p in INDEXERS if f"sglang/{p}" in members]
    calls = any(DEEP_GEMM_LOGITS.search(wheels.member(release, m)) for m in indexers)
    fallback = INDEXER_FALLBACK.get(version) is not None
    dsa_on_cuda = version >= Version("0.5.9")  # before, nothing chooses DSA on CUDA (see patch)
    assert (version in DSA_GAP.releases) == (dsa_on_cuda and calls and not fallback)
    for member in indexers if version in DSA_GAP.releases else ():
        source = wheels.member(release, member).decode()
        assert "get_device_capability" not in source and "SGLANG_FP8_PAGED_MQA" not in source


@pytest.mark.wheel
def test_doctor_does_not_call_a_dsa_model_ready_on_0_5_9_after_apply(tmp_path: Path) -> None:
    site = wheels.full_tree(SEED, tmp_path / "site")
    api.apply(site, None, tmp_path / "ledger")
    runner = CliRunner()

    def doctor(*args: str) -> tuple[int, dict[str, object]]:
        result = runner.invoke(app, ["doctor", "--target", str(site), "--json", *args])
        return result.exit_code, json.loads(result.stdout)

    code, report = doctor("--model", V32)
    assert code == ExitCode.GAPS and not report["ready"]
    assert [(b["source"], b["fixed_by"]) for b in report["blockers"]] == [(DSA_GAP.id, None)]
    assert report["verdict"].endswith("1 blocker, none fixed by `sglpatch apply`")
    code, report = doctor("--model", V3)  # DeepSeek-V3 shares the class: only with index_topk
    assert code == 0 and report["ready"]
    assert [(b["source"], b["when"]) for b in report["opt_in"]] == [(DSA_GAP.id, DSA_GAP.when)]
    code, report = doctor()
    assert code == 0 and [b["source"] for b in report["known"]] == [DSA_GAP.id]
    text = runner.invoke(app, ["doctor", "--target", str(site), "--model", V32]).stdout
    assert f"no patch yet ({DSA_GAP.id}); fix: SGLang 0.5.22 or later" in text
