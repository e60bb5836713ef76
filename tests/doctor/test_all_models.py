"""`sglpatch doctor --all-models` (issue #33): one row per architecture, checkpoint and part,
judged through the release's own start-up code, the catalogue's pending patches and the known
gaps, on real release trees; the rows after `sglpatch apply` are the rows' own `after_apply`;
`--model X` carries the same rows as `--all-models`."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.doctor import ModelRow
from sglpatch.doctor.facts import model_configs
from sglpatch.errors import ExitCode
from tests.support import wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

PARTS = ("12.0", "12.1")


@pytest.fixture(scope="module")
def rows(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ModelRow, ...]]:
    folder = tmp_path_factory.mktemp("all-models")
    found = {}
    for release in (SEED, "0.5.16", "0.5.23"):
        site = wheels.full_tree(release, folder / release)
        report = api.diagnose(site, all_models=True, capability=None)
        assert report.diagnosis.rows is not None
        found[release] = report.diagnosis.rows
    return found


def one(rows: Sequence[ModelRow], arch: str, quantization: str | None, form: str | None = None,
        part: str = "12.0") -> ModelRow:  # fmt: skip
    (row,) = [
        r
        for r in rows
        if (r.architecture, r.quantization, r.form, r.capability)
        == (arch, quantization, form, part)
    ]
    return row


@pytest.mark.parametrize("part", PARTS)
def test_examples_on_the_seed(rows: dict[str, tuple[ModelRow, ...]], part: str) -> None:
    seed = rows[SEED]
    # GPT-OSS MXFP4: the start-up gives trtllm-gen MXFP4 MoE (SM100 only), where the release
    # sets it; sm120-mxfp4-moe-backend changes that choice to one that runs.
    # 12.0 and 12.1 apart: its attention is Triton's, which on GB10 needs a ptxas that knows
    # sm_121a (the table's `needs`), and then that is what is left.
    gpt_oss = one(seed, "GptOssForCausalLM", "mxfp4", part=part)
    if part == "12.0":
        assert (gpt_oss.now, gpt_oss.after_apply) == ("breaks", "runs")
        assert "flashinfer_mxfp4" in gpt_oss.why and gpt_oss.file == "sglang/srt/server_args.py"
        assert gpt_oss.line
    else:
        assert (gpt_oss.now, gpt_oss.after_apply) == ("breaks", "needs")
        assert "sm_121a" in gpt_oss.why
    assert "sm120-mxfp4-moe-backend" in gpt_oss.patches
    # Block FP8 at run time: DeepGEMM, then FlashInfer trtllm (the two patches).
    llama = one(seed, "LlamaForCausalLM", "fp8", part=part)
    assert (llama.now, llama.after_apply) == ("breaks", "runs")
    assert {"sm120-deep-gemm-off", "sm120-fp8-block-gemm-triton"} <= set(llama.patches)
    assert one(seed, "LlamaForCausalLM", None, part=part).now == "runs"
    # The hybrid-GDN assertion stops Qwen3-Next at start-up.
    qwen = one(seed, "Qwen3NextForCausalLM", None, part=part)
    assert (qwen.now, qwen.after_apply, qwen.patches) == (
        "breaks",
        "runs",
        ("sm120-hybrid-gdn-backend",),
    )
    # DSA: the backends and the indexer's DeepGEMM calls; the same class without index_topk
    # (DeepSeek-V3) is MLA, and no DSA patch is on its path.
    # After apply the rest of the indexer is not judged: the row says so rather than "runs".
    dsa = one(seed, "DeepseekV3ForCausalLM", None, "dsa", part)
    assert (dsa.now, dsa.after_apply) == ("breaks", "not evaluated")
    assert {"sm120-dsa-backends", "sm120-dsa-indexer-torch-logits"} <= set(dsa.patches)
    assert "indexer" in dsa.why
    plain = one(seed, "DeepseekV3ForCausalLM", None, part=part)
    assert plain.now == ("runs" if part == "12.0" else "needs") and not plain.patches


def test_load_time_auto_and_what_apply_cannot_fix(rows: dict[str, tuple[ModelRow, ...]]) -> None:
    # 0.5.16: NVFP4 MoE turns `auto` into trtllm-gen when it loads the weights; the patch makes
    # the start-up choose a backend that runs on 12, which the resolution shows.
    nvfp4 = one(rows["0.5.16"], "DeepseekV3ForCausalLM", "modelopt_fp4")
    assert (nvfp4.now, nvfp4.after_apply) == ("breaks", "runs")
    assert nvfp4.patches == ("sm120-nvfp4-moe-checkpoint-quant",)
    # 0.5.16+: the block-FP8 GEMM 12 gets at run time is not judged: not "runs".
    fp8 = one(rows["0.5.16"], "LlamaForCausalLM", "fp8")
    assert fp8.after_apply == "not evaluated" and "fp8:cutlass" in fp8.why
    assert one(rows[SEED], "LlamaForCausalLM", "fp8").after_apply == "runs"  # Triton's
    # 0.5.23: IQuestQ1 requires FA3, which has no capability-12 build: no patch, breaks after.
    iquest = one(rows["0.5.23"], "IQuestQ1ForCausalLM", None)
    assert (iquest.now, iquest.after_apply) == ("breaks", "breaks")
    assert "fa3" in iquest.why and not iquest.patches
    # 0.5.19+ declare the choice in a model override: the row names that override's file.
    assert iquest.file == "sglang/srt/arg_groups/model_overrides/iquest_q1.py" and iquest.line
    olmo = one(rows["0.5.23"], "Olmo2ForCausalLM", None)
    assert (olmo.now, olmo.after_apply, olmo.patches) == (
        "breaks",
        "runs",
        ("sm120-olmo-fa3-fallback",),
    )
    gb10 = one(rows["0.5.23"], "Olmo2ForCausalLM", None, part="12.1")  # its fallback is Triton
    assert (gb10.now, gb10.after_apply) == ("breaks", "needs") and "ptxas" in gb10.why
    # 12.1 alone: public reports disagree about NVFP4 MoE's output on GB10.
    nvfp4_gb10 = one(rows["0.5.16"], "DeepseekV3ForCausalLM", "modelopt_fp4", part="12.1")
    assert nvfp4_gb10.after_apply == "not evaluated" and "on 12.1" in nvfp4_gb10.why


def test_not_evaluated_is_never_runs(rows: dict[str, tuple[ModelRow, ...]]) -> None:
    for release, found in rows.items():
        for row in found:
            assert row.capability in PARTS
            if row.now == "not evaluated":
                # Only a patch that covers what was not read can make it run after apply.
                assert row.why, (release, row)
                assert row.after_apply == "not evaluated" or row.patches, (release, row)
            if row.now == "runs":
                assert row.after_apply == "runs" and not row.patches, (release, row)
        # MiniCPM-SALA's start-up reads two fields of its config that no published config
        # records (transformers computes them): the default would be a guess, so not evaluated.
        if release == "0.5.23":
            sala = one(found, "MiniCPMSALAForCausalLM", None)
            assert sala.now == "not evaluated" and "has_minicpm_sparse_attention" in sala.why


def test_the_published_configs_decide(rows: dict[str, tuple[ModelRow, ...]]) -> None:
    """facts/model_configs.json: EXAONE 4's `sliding_window_pattern` (read without a default)
    and HunYuan-V4's `learnable_sink` (read with the default False) change the answer."""
    exaone = one(rows["0.5.23"], "Exaone4ForCausalLM", None)
    assert (exaone.now, exaone.after_apply, exaone.patches) == (
        "breaks",
        "runs",
        ("sm120-exaone-fa3-fallback",),
    )
    assert "fa3" in exaone.why
    # 0.5.9 asserts one of fa3/triton/trtllm_mha for a sliding-window EXAONE before it picks a
    # backend, on every GPU: a flag is needed everywhere, which is no gap of 12's.
    old = one(rows[SEED], "Exaone4ForCausalLM", None)
    assert (old.now, old.after_apply) == ("not evaluated", "not evaluated")
    assert "refuses every GPU (10.0 too)" in old.why
    assert old.file == "sglang/srt/server_args.py" and old.line
    # The sink picks flashmla_sparse (the release refuses any other DSA backend with a sink),
    # and FlashMLA's kernels carry no 12.x image: broken before and after apply, on both parts.
    for part in PARTS:
        sink = one(rows["0.5.23"], "HYV4ForCausalLM", None, "dsa", part)
        assert (sink.now, sink.after_apply) == ("breaks", "breaks"), sink
        assert "flashmla_sparse" in sink.why


@pytest.mark.parametrize("release", [SEED, "0.5.23"])
def test_after_apply_the_rows_are_the_after_apply(tmp_path: Path, release: str) -> None:
    site = wheels.full_tree(release, tmp_path / release)
    before = api.diagnose(site, all_models=True).diagnosis.rows
    api.apply(site, None)
    after = api.diagnose(site, all_models=True).diagnosis.rows
    assert before is not None and after is not None
    expected = {r[:4]: r.after_apply for r in before}
    assert {r[:4]: r.now for r in after} == expected
    assert not any(r.patches for r in after)


@pytest.mark.parametrize(
    ("release", "model"),
    [
        (SEED, "gpt_oss"),
        (SEED, "qwen3_next"),
        (SEED, "deepseek_v2"),
        ("0.5.23", "iquest_q1"),
        ("0.5.23", "exaone4"),
        ("0.5.23", "olmo2"),
    ],
)
def test_model_rows_are_the_all_models_rows(
    rows: dict[str, tuple[ModelRow, ...]], tmp_path: Path, release: str, model: str
) -> None:
    site = wheels.full_tree(release, tmp_path / release)
    asked = api.diagnose(site, model).diagnosis
    assert asked.rows
    names = {r.architecture for r in asked.rows}
    assert [r for r in rows[release] if r.architecture in names] == list(asked.rows)


def test_cli_table_and_json(rows: dict[str, tuple[ModelRow, ...]], tmp_path: Path) -> None:
    site = wheels.full_tree(SEED, tmp_path / SEED)
    runner = CliRunner()
    shown = runner.invoke(app, ["doctor", "--target", str(site), "--all-models"])
    assert shown.exit_code == ExitCode.GAPS, shown.output
    line = next(s for s in shown.stdout.splitlines() if s.strip().startswith("GptOssForCausalLM"))
    # bf16 fp8 nvfp4 mxfp4, 12.0/12.1 where they differ: GB10 needs a ptxas for its Triton
    # attention; before 0.5.11 no release names NVFP4 MoE's load-time backend.
    assert line.split()[1:] == ["runs/needs", "apply/needs", "n/e", "apply/needs"]
    assert "Models on 12.0 and 12.1 (SGLang 0.5.9, default flags;" in shown.stdout
    data = json.loads(
        runner.invoke(app, ["doctor", "--target", str(site), "--all-models", "--json"]).stdout
    )
    assert data["schema"] == 3
    assert [ModelRow(**r) for r in data["models"]] == [
        r._replace(patches=list(r.patches))
        for r in rows[SEED]  # type: ignore[arg-type]
    ]
    refused = runner.invoke(app, ["doctor", "--target", str(site), "--all-models", "-m", "x"])
    assert refused.exit_code == ExitCode.USAGE
    assert "--all-models" in refused.output and "Traceback" not in refused.output


# Fields the release reads of a recorded family that no published config we found holds (the
# source says why): their rows stay "not evaluated". Any other read field a record lacks fails.
UNSOURCED = {
    "HYV4ForCausalLM": {"index_kpool", "index_topk_freq", "index_topk_pattern"},
    "MiniCPMSALAForCausalLM": {"has_minicpm_sparse_attention", "has_lightning_layers"},
}


def test_a_recorded_family_records_every_field_read(
    rows: dict[str, tuple[ModelRow, ...]],
) -> None:
    recorded = {a for f in model_configs.families() for a in f.architectures}
    for release, found in rows.items():
        for row in found:
            if row.architecture not in recorded:
                continue
            assert "the stand-in hf_config has no" not in row.why, (release, row)
            if "not recorded" not in row.why:
                continue
            read = set(row.why.split("start-up read ", 1)[1].split(" of ", 1)[0].split(", "))
            assert read <= UNSOURCED.get(row.architecture, set()), (release, row)


def test_a_checkout_gives_the_installed_rows(
    rows: dict[str, tuple[ModelRow, ...]], tmp_path: Path
) -> None:
    """The same release as a checkout of the repository (python/sglang, its pyproject.toml's
    dependencies for what is installed beside it) gives the rows of the installed wheel."""
    site = wheels.full_tree(SEED, tmp_path / "site")
    root = tmp_path / "checkout"
    (root / "python").mkdir(parents=True)
    (site / "sglang").rename(root / "python" / "sglang")
    (metadata,) = site.glob("sglang-*.dist-info/METADATA")
    required = [
        line.split(":", 1)[1].strip()
        for line in metadata.read_text().split("\n\n", 1)[0].splitlines()
        if line.startswith("Requires-Dist:") and "extra ==" not in line
    ]
    listed = "".join(f'    "{r}",\n' for r in required)
    (root / "python" / "pyproject.toml").write_text(f"[project]\ndependencies = [\n{listed}]\n")
    checkout = api.diagnose(root, version=SEED, all_models=True).diagnosis
    assert checkout.rows == rows[SEED]
