"""doctor on the real wheels: the verdict before and after apply, the gates it finds and the ones
it must not report, the EAGLE-3 census; then the scanner's rules on small written examples.

Nothing here counts the catalogue's patches: other patches arrive over time, so the tests say
"every blocker is fixed by apply" and "after apply: ready", not "3 blockers".
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from sglpatch import api, catalogue
from sglpatch.cli import app
from sglpatch.doctor.gates import devices, scanner
from sglpatch.errors import ExitCode
from sglpatch.results import Applied
from tests.support.releases import SEED

KIMI = "KimiK25ForConditionalGeneration"
# The kernel table's Triton need on 12.1 (facts/kernel_support.json), as the verdict says it.
PTXAS = (
    "a ptxas that knows sm_121a (CUDA 12.9+; Triton 3.5.1 bundles ptxas 12.8.93, which does not: "
    "docs/kernels.md)"
)
KIMI_PATCH = "kimi-k25-eagle3-interface"


@pytest.fixture(scope="session")
def applied(trees: dict[str, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The same releases after `sglpatch apply` (with its own ledger)."""
    folder = tmp_path_factory.mktemp("doctor-applied")
    done = {}
    for release, tree in trees.items():
        site = folder / release
        shutil.copytree(tree, site)
        api.apply(site, None, folder / f"ledger-{release}")
        done[release] = site
    return done


def run_doctor(site: Path, *args: str) -> tuple[int, dict[str, Any]]:
    result = CliRunner().invoke(app, ["doctor", "--target", str(site), "--json", *args])
    assert result.exit_code in (0, ExitCode.GAPS), result.output
    return result.exit_code, json.loads(result.stdout)


def pending_patches(site: Path, ledger: Path) -> set[str]:
    """The capability-12 patches `apply --dry-run` says it would apply (patches to models
    modules concern one model: left out)."""
    report = api.apply(site, None, ledger, dry_run=True)
    return {
        o.patch_id
        for o in report.outcomes
        if isinstance(o, Applied) and not o.file.startswith("sglang/srt/models/")
    }


def accounted(report: dict[str, Any], unique: bool = True) -> Any:
    """The ids of every pending patch (and model) doctor lists: blockers, opt-in, table-only,
    and those about other models; as a list (`unique` False) to count repeats."""
    found = [b["source"] for key in ("blockers", "opt_in", "tables") for b in report[key]]
    found += report["not_for_this_model"]
    return set(found) if unique else found


def finding_at(report: dict[str, Any], file: str, code: str) -> list[dict[str, Any]]:
    """Suspects and refusals in `file` whose deciding line holds `code`."""
    return [
        f
        for f in report["suspects"] + report["refusals"]
        if f["file"] == file and code in f["code"]
    ]


# --- the verdict on real releases ----------------------------------------------------------


@pytest.mark.wheel
def test_0_5_9_kimi_has_blockers_all_fixed_by_apply(trees: dict[str, Path], tmp_path: Path) -> None:
    code, report = run_doctor(trees[SEED], "--model", KIMI, "--eagle3")
    assert code == ExitCode.GAPS and not report["ready"]
    assert report["verdict"].startswith(f"capability 12 + EAGLE-3 on {KIMI} (SGLang 0.5.9): ")
    assert report["verdict"].endswith("fixed by `sglpatch apply`")
    blockers = report["blockers"]
    assert blockers and all(b["fixed_by"] for b in blockers)
    # Kimi's missing EAGLE-3 methods are one blocker, fixed by the patch that adds them.
    (kimi,) = [b for b in blockers if b["source"] == KIMI]
    assert "get_embed_and_head" in kimi["what"] and kimi["fixed_by"] == KIMI_PATCH
    # Every catalogue patch with work on 0.5.9 is listed once, with its declared symptom: a
    # blocker, opt-in (symm-mem; Kimi K2's block-FP8 checkpoint with `--fp8-gemm-backend
    # flashinfer_trtllm`; double sparsity, whose head sizes a model named without its config
    # does not settle), table-only (two-shot), or about other models.
    catalog = {p.id: p for p in catalogue.load()}
    sources = {b["source"] for b in blockers} - {KIMI}
    listed = sorted(accounted(report) - {KIMI})
    assert set(listed) == pending_patches(trees[SEED], tmp_path / "ledger")
    assert len(listed) == len(accounted(report, unique=False)) - 1  # each patch once
    opt_in = [b["source"] for b in report["opt_in"]]
    assert opt_in == [
        "sm120-double-sparsity-blocks",
        "sm120-fp8-gemm-trtllm-refusal",
        "sm120-symm-mem-sizes",
    ]
    assert "sm120-symm-mem-two-shot" in {b["source"] for b in report["tables"]}
    assert all(b["what"] == catalog[b["source"]].symptom for b in blockers if b["source"] != KIMI)
    assert sources and all(catalog[s].concerns.flag is None for s in sources)


@pytest.mark.wheel
def test_0_5_9_kimi_is_ready_after_apply(applied: dict[str, Path]) -> None:
    result = CliRunner().invoke(
        app, ["doctor", "--target", str(applied[SEED]), "--model", KIMI, "--eagle3"]
    )
    assert result.exit_code == 0, result.stdout
    first = result.stdout.splitlines()[0]
    # Both parts judged, no Triton beside SGLang: 12.1's Triton needs a ptxas for sm_121a.
    assert first.startswith(f"capability 12 + EAGLE-3 on {KIMI} (SGLang 0.5.9): ready once ")
    assert first.endswith(f"12.1 has {PTXAS}")
    assert "has them all" in result.stdout
    args = ["doctor", "--target", str(applied[SEED]), "--model", KIMI, "--eagle3"]
    rtx = CliRunner().invoke(app, [*args, "--capability", "12.0"])
    assert rtx.stdout.splitlines()[0] == f"capability 12 + EAGLE-3 on {KIMI} (SGLang 0.5.9): ready"


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.10", "0.5.23"])
def test_later_releases_kimi_has_its_methods_and_apply_clears_the_rest(
    release: str, trees: dict[str, Path], applied: dict[str, Path], tmp_path: Path
) -> None:
    code, before = run_doctor(trees[release], "--model", "kimi_k25", "--eagle3")
    assert before["model"] == KIMI
    assert before["eagle3"]["models"][KIMI]["missing"] == []  # upstream since 0.5.10
    pending = pending_patches(trees[release], tmp_path / "ledger")
    assert accounted(before) == pending
    assert all(b["fixed_by"] for b in before["blockers"])
    assert (code == 0) == (not before["blockers"])
    code, after = run_doctor(applied[release], "--model", KIMI, "--eagle3")
    assert code == 0 and after["ready"] and after["blockers"] == []
    verdict = f"capability 12 + EAGLE-3 on {KIMI} (SGLang {release}): ready"
    assert after["verdict"] == f"{verdict} once 12.1 has {PTXAS}"


@pytest.mark.wheel
def test_strict_makes_suspects_blockers(applied: dict[str, Path]) -> None:
    code, report = run_doctor(applied[SEED], "--model", KIMI, "--strict")
    assert code == ExitCode.GAPS and report["strict"]
    assert len(report["blockers"]) == len(report["suspects"]) > 0


# --- what the scanner finds on 0.5.9 (the list) ----------------------------------------


@pytest.fixture(scope="session")
def report_059(trees: dict[str, Path]) -> dict[str, Any]:
    return run_doctor(trees[SEED])[1]


@pytest.mark.wheel
@pytest.mark.parametrize(
    ("file", "code"),
    [
        # FA4's cute interface supports 9/10/11 by design: refusals only, never a suspect.
        ("sglang/jit_kernel/flash_attention/cute/interface.py", ""),
        # FA3 refuses 10 and 12 alike and points to flashinfer.
        ("sglang/srt/layers/attention/attention_registry.py", "get_device_capability()[0] == 9"),
        # 10 and 12 both get triton.
        ("sglang/srt/layers/attention/vision.py", "if major == 9:"),
        # the quantization check allows 12 two lines later.
        ("sglang/multimodal_gen/configs/quantization.py", ""),
        # 10 and 12 are rejected alike.
        ("sglang/srt/multiplex/pdmux_context.py", ""),
    ],
)
def test_0_5_9_false_positives_are_gone(report_059: dict[str, Any], file: str, code: str) -> None:
    assert (Path(report_059["target"]) / file).is_file()
    suspects = [s for s in report_059["suspects"] if s["file"] == file and code in s["code"]]
    assert suspects == []


@pytest.mark.wheel
@pytest.mark.parametrize(
    ("file", "code", "gets"),
    [
        # DeepGEMM is on for 12: it passes `sm_version < 90` like 9 and 10.
        ("sglang/srt/layers/deep_gemm_wrapper/configurer.py", "sm_version < 90", "fp8:deep_gemm"),
        # the FP8 block-GEMM backend picks FlashInfer's SM100-only trtllm GEMM for 12: an
        # `elif` behind a first test about DeepGEMM, the gate inside an `and` chain.
        (
            "sglang/srt/layers/quantization/fp8_utils.py",
            "elif is_blackwell_supported() and is_flashinfer_available():",
            "fp8:flashinfer_trtllm",
        ),
        # gpt-oss: MXFP4 MoE backend flashinfer_mxfp4 on every Blackwell.
        (
            "sglang/srt/server_args.py",
            "is_blackwell_supported() and is_mxfp4_quant_format",
            "flashinfer_mxfp4",
        ),
        # Olmo: not SM100, so `get_device_sm() >= 80` sends 12 to fa3.
        ("sglang/srt/server_args.py", "is_cuda() and is_sm100_supported()", "gets fa3"),
    ],
)
def test_0_5_9_failing_gates_are_reported_with_why(
    report_059: dict[str, Any], file: str, code: str, gets: str
) -> None:
    found = [s for s in report_059["suspects"] if s["file"] == file and code in s["code"]]
    assert found, f"no suspect at {file}: {code}"
    (suspect,) = found
    assert suspect["verdict"] == "fails" and gets in suspect["what"], suspect
    # the table's fact, named as the table's: measured on the builds it names, not read here
    assert " only (kernel-support table: " in suspect["what"] and suspect["opt_in"] is None


@pytest.mark.wheel
def test_0_5_9_llama4_gets_triton_not_intel_xpu(trees: dict[str, Path]) -> None:
    """`elif self.device == "xpu":` is false on NVIDIA: 12 falls through to triton."""
    path = trees[SEED] / "sglang/srt/server_args.py"
    found = scanner.scan_bytes(
        path.read_bytes(), "sglang/srt/server_args.py", devices.KNOWN_HELPERS
    )
    (llama4,) = [f for f in found if '"trtllm_mha", "sm100"' in f.like]
    assert '"triton", "other platforms"' in llama4.gets and "intel_xpu" not in llama4.gets
    assert llama4.chosen("12.0") == (("12.0", "attention", "triton", "attention_backend", ""),)


@pytest.mark.wheel
def test_0_5_9_a_patch_covers_only_the_gate_it_changes(report_059: dict[str, Any]) -> None:
    suspects = report_059["suspects"]
    tables = {s["file"]: s["covered_by"] for s in suspects if s["kind"] == "table"}
    communicators = "sglang/srt/distributed/device_communicators"
    assert tables[f"{communicators}/all_reduce_utils.py"] == "sm120-symm-mem-sizes"
    assert tables[f"{communicators}/torch_symm_mem.py"] == "sm120-symm-mem-two-shot"
    by_code = {s["code"]: s for s in suspects if s["file"] == "sglang/srt/server_args.py"}
    # The MXFP4 patch adds a capability-12 test to _handle_model_specific_adjustments: it
    # covers the MXFP4 gate, not Olmo2's fa3 choice in the same function.
    mxfp4 = by_code["if is_blackwell_supported() and is_mxfp4_quant_format:"]
    assert mxfp4["covered_by"] == "sm120-mxfp4-moe-backend"
    olmo = by_code["if is_cuda() and is_sm100_supported():"]
    assert olmo["covered_by"] != "sm120-mxfp4-moe-backend"


@pytest.mark.wheel
def test_0_5_9_a_choice_that_runs_on_12_is_not_listed(report_059: dict[str, Any]) -> None:
    """Llama4's `else: triton` (triton runs on 12) is counted harmless, not listed."""
    listed = report_059["suspects"] + report_059["suspects_not_judged"]
    assert not [s for s in listed if '"triton", "other platforms"' in s["gets"]]
    assert report_059["suspects_harmless"] > 0 and report_059["schema"] == 3


@pytest.mark.wheel
def test_0_5_23_failing_choices_are_reported(trees: dict[str, Path]) -> None:
    report = run_doctor(trees["0.5.23"])[1]
    fails = {(s["file"], s["verdict"]): s for s in report["suspects"]}
    olmo = fails[("sglang/srt/arg_groups/model_overrides/olmo2.py", "fails")]
    assert "gets fa3" in olmo["what"]
    unjudged = {s["file"]: s for s in report["suspects_not_judged"]}
    # 0.5.23's automatic FP8 block GEMM on 12 is sgl-kernel's CUTLASS: not in the table.
    assert "fp8:cutlass" in unjudged["sglang/srt/layers/quantization/fp8_utils.py"]["what"]


@pytest.mark.wheel
def test_0_5_9_eagle3_census_counts_generation_models_only(report_059: dict[str, Any]) -> None:
    eagle3 = report_059["eagle3"]
    assert eagle3["required"] == ["get_embed_and_head", "set_eagle3_layers_to_capture"]
    models, excluded = eagle3["models"], eagle3["excluded"]
    for name in ("BertModel", "CLIPModel", "Qwen2ForRewardModel", "LlamaEmbeddingModel"):
        assert name in excluded and name not in models
    assert "DeepseekV3ForCausalLMNextN" in excluded  # a draft model
    assert "LlamaForCausalLMEagle3" in excluded
    assert models["LlamaForCausalLM"]["missing"] == []
    assert models["DeepseekV3ForCausalLM"]["missing"] == []  # through DeepseekV2ForCausalLM
    assert models[KIMI] == {
        "module": "sglang/srt/models/kimi_k25.py",
        "missing": ["get_embed_and_head", "set_eagle3_layers_to_capture"],
        "fixed_by": KIMI_PATCH,
    }
    assert report_059["blockers"] and KIMI not in {b["source"] for b in report_059["blockers"]}


@pytest.mark.wheel
def test_model_by_architecture_stem_or_checkpoint(trees: dict[str, Path], tmp_path: Path) -> None:
    checkpoint = tmp_path / "Kimi-K2.5"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text(json.dumps({"architectures": [KIMI]}))
    site = trees[SEED]
    by_name = run_doctor(site, "--model", KIMI)[1]
    by_stem = run_doctor(site, "--model", "kimi_k25")[1]
    by_path = run_doctor(site, "--model-path", str(checkpoint))[1]
    assert by_name["model"] == by_stem["model"] == by_path["model"] == KIMI
    assert by_name["blockers"] == by_stem["blockers"]
    # The checkpoint's config.json declares no quantization (issue 34): the quantization
    # patches that block "if the checkpoint is ..." by name block no unquantized checkpoint.
    assert by_path["quantization"] == "unquantized" and by_name["quantization"] is None
    conditional = [b for b in by_name["blockers"] if b["when"].startswith("if the checkpoint is")]
    assert conditional and by_path["blockers"] == [
        b for b in by_name["blockers"] if b not in conditional
    ]


@pytest.mark.wheel
def test_a_near_miss_suggests_model_files_and_classes(trees: dict[str, Path]) -> None:
    result = CliRunner().invoke(app, ["doctor", "-t", str(trees[SEED]), "--model", "kimi-k2.5"])
    assert result.exit_code == ExitCode.USAGE
    assert "did you mean" in result.stderr
    assert "kimi_k25" in result.stderr and KIMI in result.stderr


@pytest.mark.wheel
def test_a_new_call_in_the_worker_is_a_new_requirement(
    trees: dict[str, Path], tmp_path: Path
) -> None:
    site = tmp_path / "site"
    shutil.copytree(trees[SEED], site)
    worker = site / "sglang" / "srt" / "speculative" / "eagle_worker.py"
    text = worker.read_text()
    anchor = "        embed, head = self.target_worker.model_runner.model.get_embed_and_head()\n"
    assert anchor in text
    worker.write_text(
        text.replace(
            anchor,
            anchor
            + "        self.target_worker.model_runner.model.get_draft_vocab_map()\n"
            + '        if hasattr(self.target_worker.model_runner.model, "optional_hook"):\n'
            + "            self.target_worker.model_runner.model.optional_hook()\n",
        )
    )
    found = api.diagnose(site, "kimi_k25").diagnosis
    assert "get_draft_vocab_map" in found.required
    assert "optional_hook" not in found.required  # guarded by hasattr: not required
    assert found.model is not None and "get_draft_vocab_map" in found.model.missing
    deepseek = api.diagnose(site, "deepseek_v2").diagnosis
    assert all("get_draft_vocab_map" in m.missing for m in deepseek.models)
