"""doctor's blockers are about the model asked for (issue 22 point 4), and blockers block (issue 20
point 4): on the real wheels, each pending patch is judged by what it declares it `concerns` and
its `effect` on the release.

No test here counts the catalogue: it grows. They say "no GPT-OSS patch is a Kimi blocker",
"every blocker concerns the model", "each pending patch is listed exactly once".
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api, catalogue
from sglpatch.cli import app
from sglpatch.doctor import diagnosis
from sglpatch.errors import ExitCode
from sglpatch.patch import Effect, Patch
from sglpatch.results import Applied
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

KIMI, KIMI_PY = "KimiK25ForConditionalGeneration", "sglang/srt/models/kimi_k25.py"
QWEN3_NEXT, QWEN3_NEXT_PY = "Qwen3NextForCausalLM", "sglang/srt/models/qwen3_next.py"
# The patches of other models on 0.5.9: Qwen3-Next/Qwen3.5 and GPT-OSS.
NOT_KIMI = {
    "sm120-hybrid-gdn-backend",
    "sm120-mxfp4-moe-backend",
    "sm120-triton-kernels-mxfp4-block-k",
}
SYMM_MEM_SIZES = "sm120-symm-mem-sizes"
PREFILL = "sm120-prefill-attention-block"
CATALOG = {p.id: p for p in catalogue.load()}


@pytest.fixture(scope="module")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("doctor-model")
    return {r: wheels.full_tree(r, folder / r) for r in (SEED, "0.5.14", "0.5.23")}


def doctor(site: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["doctor", "--target", str(site), "--json", *args])
    assert result.exit_code in (0, ExitCode.GAPS), result.output
    return result.exit_code, json.loads(result.stdout)


def ids(rows: list[dict[str, Any]]) -> list[str]:
    return [row["source"] for row in rows]


def pending(site: Path, ledger: Path) -> set[str]:
    """What `apply --dry-run` would apply, but patches to models modules (one model's each)."""
    report = api.apply(site, None, ledger, dry_run=True)
    return {
        o.patch_id
        for o in report.outcomes
        if isinstance(o, Applied) and not o.file.startswith("sglang/srt/models/")
    }


def concerns_model(patch: Patch, names: set[str], module: Path) -> bool:
    """What a blocker's patch must declare to block the start-up of the model `names`, defined
    in `module`: every model, or one of its names, or a module that one imports from."""
    concerns = patch.concerns
    named = bool(set(concerns.architectures) & names)
    text = module.read_text()
    used = any(f"from {u} import" in text or f"from {u}." in text for u in concerns.uses)
    return (
        concerns.flag is None
        and concerns.runtime == "srt"
        and (concerns.every_model or named or used)
    )


def test_0_5_23_qwen3_next_blocks_on_its_own_patches_only(trees: dict[str, Path]) -> None:
    """Before: "not ready" from the vision-only prefill kernel and the opt-in communicator."""
    code, report = doctor(trees["0.5.23"], "--model", "qwen3_next")
    assert report["verdict"].startswith(f"capability 12 with {QWEN3_NEXT} (SGLang 0.5.23): ")
    assert (code == 0) == report["ready"] == (not report["blockers"])
    blockers = ids(report["blockers"])
    assert all(
        concerns_model(CATALOG[b], {QWEN3_NEXT}, trees["0.5.23"] / QWEN3_NEXT_PY) for b in blockers
    ), blockers
    # Qwen3-Next has no ViT: the Triton prefill kernel is another model's.
    assert PREFILL in report["not_for_this_model"] and PREFILL not in blockers
    # The symmetric-memory row changes nothing on 0.5.23: no blocker, not even an opt-in one.
    assert SYMM_MEM_SIZES in ids(report["tables"])
    assert SYMM_MEM_SIZES not in blockers + ids(report["opt_in"])
    assert report["eagle3"]["models"][QWEN3_NEXT]["missing"] == []


def test_0_5_9_kimi_lists_no_gpt_oss_or_qwen3_next_patch_as_a_blocker(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    code, report = doctor(trees[SEED], "--model", KIMI)
    assert code == ExitCode.GAPS
    blockers = set(ids(report["blockers"])) - {KIMI}
    assert not blockers & NOT_KIMI
    assert set(report["not_for_this_model"]) >= NOT_KIMI
    assert all(concerns_model(CATALOG[b], {KIMI}, trees[SEED] / KIMI_PY) for b in blockers), (
        blockers
    )
    # The opt-in communicator is listed apart with its flag, not as a blocker.
    (sizes,) = [b for b in report["opt_in"] if b["source"] == SYMM_MEM_SIZES]
    assert sizes["when"] == "with --enable-torch-symm-mem" and sizes["fixed_by"] == SYMM_MEM_SIZES
    # A quantization-specific patch blocks with its condition: the checkpoint's is not known.
    fp8 = [b for b in report["blockers"] if b["source"] == "sm120-deep-gemm-off"]
    assert [b["when"] for b in fp8] == ["if the checkpoint is fp8"]
    # Every pending patch is in exactly one list; the interface patch is the model's blocker.
    listed = [*ids(report["blockers"]), *ids(report["opt_in"]), *ids(report["tables"])]
    listed += report["not_for_this_model"]
    assert sorted(listed) == sorted(set(listed))
    assert set(listed) - {KIMI} == pending(trees[SEED], tmp_path / "ledger")


@pytest.mark.parametrize(
    ("release", "blocks"), [("0.5.9", True), ("0.5.14", False), ("0.5.23", False)]
)
def test_symm_mem_sizes_blocks_only_where_it_changes_the_run(
    trees: dict[str, Path], release: str, blocks: bool
) -> None:
    """0.5.9: `--enable-torch-symm-mem` dies with KeyError: 12 without it. From 0.5.14 the
    communicator is off on every capability-12 part with or without the row."""
    assert CATALOG[SYMM_MEM_SIZES].effect_on(Version(release)) is (
        Effect.RUN if blocks else Effect.TABLE
    )
    _, report = doctor(trees[release])  # the whole release: no model
    assert (SYMM_MEM_SIZES in ids(report["blockers"])) is blocks
    assert (SYMM_MEM_SIZES in ids(report["tables"])) is not blocks
    if blocks:
        (row,) = [b for b in report["blockers"] if b["source"] == SYMM_MEM_SIZES]
        assert row["when"] == "with --enable-torch-symm-mem"
    assert all(
        CATALOG[b].effect_on(Version(release)) is Effect.RUN for b in ids(report["blockers"])
    )


def test_a_known_quantization_keeps_only_its_own_patches(trees: dict[str, Path]) -> None:
    """With the checkpoint's quantization known, an fp8 patch blocks an fp8 Kimi only."""
    package = trees[SEED] / "sglang"
    patches = catalogue.load()
    release = Version(SEED)
    int4 = diagnosis.diagnose(package, release, patches, KIMI, quantization="compressed-tensors")
    fp8 = diagnosis.diagnose(package, release, patches, KIMI, quantization="fp8")
    fp8_patches = {p.id for p in patches if p.concerns.quantization == ("fp8",)}
    assert fp8_patches and fp8_patches <= set(int4.elsewhere)
    assert not fp8_patches & {b.source for b in int4.blockers}
    rows = [b for b in fp8.blockers if b.source in fp8_patches]
    assert {b.source for b in rows} == fp8_patches and all(b.when == "" for b in rows)
    assert int4.quantization == "compressed-tensors"


def test_default_output_is_short_and_verbose_lists_every_suspect(trees: dict[str, Path]) -> None:
    site = str(trees[SEED])
    short = CliRunner().invoke(app, ["doctor", "--target", site, "--model", KIMI])
    long = CliRunner().invoke(app, ["doctor", "--target", site, "--model", KIMI, "--verbose"])
    assert short.exit_code == long.exit_code == ExitCode.GAPS
    assert short.stdout.splitlines()[0] == long.stdout.splitlines()[0]
    _, report = doctor(trees[SEED], "--model", KIMI)
    places = [f"  {s['file']}:{s['line']}: " for s in report["suspects"]]
    assert places and not any(p in short.stdout for p in places)
    assert all(p in long.stdout for p in places)
    assert "(--verbose lists them)" in short.stdout
    refusals = f"Not listed: {len(report['refusals'])} places that refuse capability 12"
    assert refusals in short.stdout and "`sglpatch doctor --verbose` lists them" in short.stdout
    assert all(f"{r['file']}:{r['line']}" in long.stdout for r in report["refusals"])
    assert f"\nNext:\n  sglpatch apply --target {site}\n" in short.stdout
    assert len(short.stdout.splitlines()) * 2 < len(long.stdout.splitlines())


def test_json_keeps_every_key_and_adds_the_new_lists(trees: dict[str, Path]) -> None:
    _, report = doctor(trees[SEED], "--model", KIMI)
    before = {
        "release", "target", "found_by", "also_found", "verdict", "ready", "strict", "model",
        "blockers", "eagle3", "suspects", "refusals", "not_judged", "kernels", "kernels_from",
    }  # fmt: skip
    added = {"opt_in", "tables", "not_for_this_model", "quantization"}
    assert before | added <= set(report)
    for row in report["blockers"] + report["opt_in"] + report["tables"]:
        assert set(row) == {"what", "source", "fixed_by", "note", "when", "parts"}
    assert report["quantization"] is None
