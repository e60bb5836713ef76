"""doctor on the real wheels: the verdict before and after apply, the gates it finds and the ones
it must not report, the EAGLE-3 census; then the scanner's rules on small written examples.

Nothing here counts the catalogue's patches: other patches arrive over time, so the tests say
"every blocker is fixed by apply" and "after apply: ready", not "3 blockers".
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import textwrap
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api, catalogue, cli
from sglpatch.cli import app
from sglpatch.doctor import coverage
from sglpatch.doctor.gates import devices, scanner
from sglpatch.doctor.read import candidates, pool
from sglpatch.doctor.read.source_tree import Source
from sglpatch.errors import CatalogueError, ExitCode
from sglpatch.results import Applied
from tests.support import wheels
from tests.support.releases import SEED

KIMI = "KimiK25ForConditionalGeneration"
KIMI_PATCH = "kimi-k25-eagle3-interface"


@pytest.fixture(scope="session")
def trees(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Whole releases, extracted once per session (4,700 files each for the newest)."""
    folder = tmp_path_factory.mktemp("doctor-trees")
    return {r: wheels.full_tree(r, folder / r) for r in (SEED, "0.5.10", "0.5.23")}


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
    # blocker, opt-in (symm-mem), table-only (two-shot), or about other models.
    catalog = {p.id: p for p in catalogue.load()}
    sources = {b["source"] for b in blockers} - {KIMI}
    listed = sorted(accounted(report) - {KIMI})
    assert set(listed) == pending_patches(trees[SEED], tmp_path / "ledger")
    assert len(listed) == len(accounted(report, unique=False)) - 1  # each patch once
    assert [b["source"] for b in report["opt_in"]] == ["sm120-symm-mem-sizes"]
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
    assert first == f"capability 12 + EAGLE-3 on {KIMI} (SGLang 0.5.9): ready"
    assert "has them all" in result.stdout


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
    assert after["verdict"] == f"capability 12 + EAGLE-3 on {KIMI} (SGLang {release}): ready"


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
    found = scanner.scan_bytes(path.read_bytes(), "sglang/srt/server_args.py", HELPERS)
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
    assert report_059["suspects_harmless"] > 0 and report_059["schema"] == 2


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


# --- small trees written here ---------------------------------------------------------------


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


def tiny_tree(root: Path, with_method: bool) -> Path:
    package = root / "site" / "sglang"
    write(package / "__init__.py", "")
    write(package / "_version.py", f'__version__ = "{SEED}"\n')  # unknown is not ready
    write(
        package / "srt" / "speculative" / "eagle_worker.py",
        """
        class EAGLEWorker:
            def init(self):
                embed, head = self.target_worker.model_runner.model.get_embed_and_head()
        """,
    )
    method = "def get_embed_and_head(self):\n        return 1, 2" if with_method else "pass"
    write(
        package / "srt" / "models" / "tiny.py",
        f"""
class Base:
    {method}

class Tiny(Base):
    def __init__(self):
        self.logits_processor = object()

class TinyEmbedding(Base):
    def __init__(self):
        self.pooler = object()

EntryClass = [Tiny, TinyEmbedding]
""",
    )
    return root / "site"


def test_a_ready_tree_exits_zero_and_says_ready(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "Tiny"])
    assert result.exit_code == 0, result.stdout
    assert result.stdout.splitlines()[0].endswith(": ready")
    assert result.stderr == ""  # no progress when stderr is not a terminal


def test_a_missing_method_blocks_and_exits_5(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=False)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "tiny", "--eagle3"])
    assert result.exit_code == ExitCode.GAPS
    assert "1 blocker, none fixed by `sglpatch apply`" in result.stdout.splitlines()[0]
    assert "Tiny lacks get_embed_and_head" in result.stdout
    census = api.diagnose(site).diagnosis
    assert [m.name for m in census.models] == ["Tiny"]  # the pooling class is no target
    assert census.ready  # without --model only known capability-12 breakage blocks


def test_progress_goes_to_a_terminal_stderr_only(
    runner: CliRunner, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    monkeypatch.setattr(cli.doctor, "_stderr_is_terminal", lambda: True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--json"])
    assert "doctor: scanning capability gates" in result.stderr
    assert json.loads(result.stdout)["ready"] is True


def test_an_unknown_model_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "nope"])
    assert result.exit_code == ExitCode.USAGE and "nope" in result.stderr


def test_model_path_without_config_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    site = tiny_tree(tmp_path, with_method=True)
    result = runner.invoke(app, ["doctor", "-t", str(site), "--model-path", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE and "config.json" in result.stderr


HELPERS = devices.KNOWN_HELPERS
IMPORTS = "from sglang.srt.utils import get_device_sm, is_blackwell, is_sm100_supported, is_sm120_supported\nimport torch\n"


@pytest.mark.parametrize(
    ("code", "kind", "gets"),
    [
        # taken apart from 10
        (
            "if torch.cuda.get_device_capability()[0] == 10:\n    a = 1\nelse:\n    a = 2\n",
            "excludes",
            "a = 2",
        ),
        (
            "if is_sm100_supported():\n    b = 'trtllm'\nelse:\n    b = 'triton'\n",
            "excludes",
            "'triton'",
        ),
        ("ok = major in (9, 10)\n", "excludes", "False"),
        ("x = 'fa' if get_device_sm() == 100 else 'tr'\n", "excludes", "'tr'"),
        (
            "_on = is_sm100_supported()\ndef f():\n    if _on:\n        return 1\n    return 2\n",
            "excludes",
            "skips",
        ),
        # grouped with 9/10 by a range or a family helper
        (
            "def f():\n    sm = get_device_sm()\n    if sm < 90:\n        return False\n    return True\n",
            "shares",
            "skips",
        ),
        ("if is_blackwell():\n    use = 'deep_gemm'\n", "shares", "deep_gemm"),
        ("ok = torch.cuda.get_device_capability() >= (9, 0)\n", "shares", "True"),
        # refusals: a clear error on 12
        ("assert major in (9, 10, 11), 'unsupported'\n", "refusal", "AssertionError"),
        (
            "if not is_sm100_supported():\n    raise ValueError('needs SM100')\n",
            "refusal",
            "raises",
        ),
        # not reported
        ("if major == 9:\n    a = 'fa3'\nelse:\n    a = 'triton'\n", None, ""),  # 10 and 12 alike
        ("if major == 8:\n    a = 1\nelse:\n    a = 2\n", None, ""),  # an Ampere special case
        ("if major == 10 or major == 12:\n    a = 1\n", None, ""),  # names 12 in the chain
        ("if torch.version.hip:\n    pass\nelif False:\n    pass\n", None, ""),
        ("if _is_hip:\n    if major == 10:\n        a = 1\n", None, ""),  # never on NVIDIA
        ("ok = get_device_sm() >= 80\n", None, ""),  # Ampere too: no SM90/SM100 path
        ("v = torch_version.major >= 2\n", None, ""),  # a library's version
        ("ok = CUDA_CAPABILITY[1] == 9\n", None, ""),  # a minor version
        (  # a code sample in a docstring is prose
            'def pick():\n    """For example:\n\n    if is_sm100_supported():\n'
            '        return "trtllm"\n    """\n    return "triton"\n',
            None,
            "",
        ),
        (
            "def f():\n    assert major in (9, 10), 'x'\n    if major == 10:\n        return 1\n",
            "refusal",
            "AssertionError",
        ),  # the rest is unreachable
    ],
)
def test_gate_rules(code: str, kind: str | None, gets: str) -> None:
    found = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/mod.py", HELPERS)
    found = [f for f in found if f.kind != "decides"]  # judged harmless unless they choose
    assert [f.kind for f in found] == ([kind] if kind else []), found
    if kind:
        assert gets in found[0].gets and found[0].line > IMPORTS.count("\n")


@pytest.mark.parametrize(
    ("code", "gets"),
    [
        ("SIZES = {9: 1, 10: 2}\nx = SIZES[capability]\n", "KeyError: 12"),
        ("SIZES = {9: 1, 10: 2, 12: 3}\nx = SIZES[capability]\n", None),
        ("SIZES = {9: 1, 10: 2}\nx = SIZES.get(capability, 0)\n", None),  # tolerant lookup
        ("WORLD = {2: 1, 4: 2, 8: 3}\nx = WORLD[n]\n", None),  # world sizes, not majors
    ],
)
def test_table_rules(code: str, gets: str | None) -> None:
    found = scanner.scan_bytes(code.encode(), "sglang/mod.py", HELPERS)
    assert [f.gets for f in found] == ([gets] if gets else [])


def test_helpers_are_read_from_the_targets_own_definition(tmp_path: Path) -> None:
    """A release that redefines a helper (here: is_blackwell without 12) is taken at its word."""
    write(
        tmp_path / "sglang" / "srt" / "utils" / "common.py",
        """
        is_blackwell = lru_cache(maxsize=1)(
            partial(_check_cuda_device_version, device_capability_majors=[10, 11], cuda_version=(12, 8))
        )
        """,
    )
    helpers = devices.helpers_of(Source(tmp_path / "sglang"))
    assert helpers["is_blackwell"] == {10, 11}
    found = scanner.scan_bytes(b"if is_blackwell():\n    a = 1\n", "sglang/m.py", helpers)
    assert [f.kind for f in found] == ["excludes"]


def test_platform_probes_are_read_from_the_targets_own_table(tmp_path: Path) -> None:
    """`get_platform().is_sm100` is the helper `_PLATFORM_PROBES` names, with its majors."""
    write(
        tmp_path / "sglang" / "srt" / "runtime_context.py",
        """
        _PLATFORM_PROBES: Dict[str, str] = {
            "is_hip": "is_hip",
            "is_sm100": "is_sm100_supported",
            "is_sm120": "is_sm120_supported",
            "is_blackwell": "is_blackwell_supported",
        }
        """,
    )
    helpers = devices.helpers_of(Source(tmp_path / "sglang"))
    assert helpers["get_platform().is_sm100"] == {10}
    assert helpers["get_platform().is_blackwell"] == {10, 11, 12}
    cases = {
        "if get_platform().is_sm100:\n    a = 1\nelse:\n    a = 2\n": ["excludes"],
        "use = 'deep_gemm' if get_platform().is_blackwell else 'triton'\n": ["shares"],
        "if get_platform().device_sm >= 90:\n    a = 1\n": ["shares"],
        # names 12 in the chain: evaluated like any other (12 takes `a = 3`, 10 does not)
        "if get_platform().is_sm120:\n    a = 3\nelif get_platform().is_sm100:\n    a = 1\n": [
            "excludes"
        ],
        # never on NVIDIA
        "if get_platform().is_hip:\n    if get_platform().is_sm100:\n        a = 1\n": [],
        # a probe the table does not know decides nothing
        "if get_platform().is_sm100_or_newer:\n    a = 1\n": [],
        # through a name the scope assigns from get_platform()
        "def f():\n    p = get_platform()\n    if p.is_sm100:\n        return 1\n    return 2\n": [
            "excludes"
        ],
        # a function that asks the is_sm120 probe: each decision is still judged on its own
        "def f():\n    if get_platform().is_sm120:\n        return 3\n"
        "    if get_platform().is_sm100:\n        return 1\n    return 2\n": [
            "excludes",
            "excludes",
        ],
    }
    for code, kinds in cases.items():
        found = scanner.scan_bytes(code.encode(), "sglang/m.py", helpers)
        assert [f.kind for f in found] == kinds, code


def test_a_patch_covers_the_finding_its_change_removes(tmp_path: Path) -> None:
    package = tmp_path / "sglang"
    write(
        package / "srt/distributed/device_communicators/all_reduce_utils.py",
        "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {9: {2: 1}, 10: {2: 2}}\n",
    )
    version = Version(SEED)
    checks = coverage.check(package, version, catalogue.load())
    findings = scanner.scan(Source(package), HELPERS)
    covered = coverage.covered_by(
        findings, checks, lambda data, shown: scanner.scan_bytes(data, shown, HELPERS)
    )
    assert [(f.kind, covered.get(f)) for f in findings] == [("table", "sm120-symm-mem-sizes")]


def test_coverage_refuses_a_patch_path_that_leaves_the_package(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The catalogue run in memory goes through `Patch.package_file`, like apply."""
    package = tmp_path / "sglang"
    package.mkdir()
    (tmp_path / "outside.py").write_text("TABLE = {9: 1, 10: 2}\n")
    patch = catalogue.load()[0]
    monkeypatch.setattr(patch, "target_file", lambda release: "../outside.py")
    monkeypatch.setattr(patch, "fixed_upstream", lambda release: False)
    with pytest.raises(CatalogueError, match=r"\.\./outside\.py"):
        coverage.check(package, Version(SEED), [patch])


def started_scan(source: Source, workers: pool.Pool) -> scanner.Scan:
    """A scan of the tree handed to `workers` (opened when the tree is large and a second core
    is there), as `diagnosis.diagnose` starts it."""
    scan = scanner.Scan(source, devices.helpers_of(source), workers)
    workers.start(len(scan.listed))
    scan.start()
    return scan


needs_pool = pytest.mark.skipif(
    pool.usable_cores() < 2, reason="one core: the scan runs in one process anyway"
)


@pytest.mark.wheel
@needs_pool
def test_the_scan_shared_with_worker_processes_equals_the_scan_in_one(
    trees: dict[str, Path],
) -> None:
    source = Source(trees[SEED] / "sglang")
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is not None
        processes = list(workers.executor._processes.values())
        found = shared.result()
    assert processes and not any(p.is_alive() for p in processes)  # ended and reaped
    assert found == scanner.scan(source, devices.helpers_of(source))
    assert len(found) > 20  # a real tree's gates, in the same order


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_git_grep_picks_the_files_the_byte_tests_would(
    trees: dict[str, Path], release: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """git finds the words in one pass; without it every file is tested here, alike."""
    source = Source(trees[release] / "sglang")
    helpers = devices.helpers_of(source)
    if scanner._GitGrep(source).files() is None:
        pytest.skip("no git here: every file is tested in Python anyway")
    picked = scanner.Scan(source, helpers)
    picked.start()
    monkeypatch.setenv("PATH", "")  # no git to run
    assert scanner._GitGrep(source).files() is None
    every = scanner.Scan(source, helpers)
    every.start()
    picked_files = {(path, shown) for path, shown, _ in picked.jobs}
    every_files = {(path, shown) for path, shown, hits in every.jobs if hits is None}
    assert len(picked_files) < len(every_files) / 4  # most files hold none of the words
    for path, shown in every_files - picked_files:  # what git left out, the byte tests reject
        assert scanner.scan_bytes(Path(path).read_bytes(), shown, helpers) == [], shown
    assert picked.result() == every.result()


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_git_greps_lines_are_the_keyword_lines_python_finds(
    trees: dict[str, Path], release: str
) -> None:
    """File by file, the lines git grep reports give what the passes through the bytes give:
    the same keyword lines, the same files left unread, the same findings."""
    source = Source(trees[release] / "sglang")
    helpers = devices.helpers_of(source)
    hits = scanner._GitGrep(source).files()
    if hits is None:
        pytest.skip("no git here: every file is read in Python anyway")
    unread = 0
    for path, shown, _ in scanner._python_files(source):
        data = Path(path).read_bytes()
        starts, lines = candidates.Starts(data), scanner.lines_of(data.decode(errors="replace"))
        found = scanner.scan_bytes(data, shown, helpers)
        reported = hits.get(shown[len("sglang/") :])
        planned = scanner._planned(tuple(reported or ()))
        if planned is None:
            unread += reported is not None
            assert found == [], shown
            continue
        assert planned == candidates.keyword_lines(data, starts, lines), shown
        assert scanner.scan_bytes(data, shown, helpers, planned) == found, shown
    assert unread > 50  # files git reports that hold no gate: never read


GATE = "def pick(args):\n    if torch.cuda.get_device_capability()[0] == 10:\n"
GATE += '        args.backend = "trtllm"\n    return args\n'


@pytest.mark.parametrize(
    "before",
    ["", "# a form feed\x0c here\n", "# U+2028 \u2028 here\n", "# NEL \x85 here\n", "x = '\r'\n"],
    ids=["plain", "form-feed", "u2028", "nel", "lone-cr"],
)
@pytest.mark.parametrize("newline", ["\n", "\r\n"], ids=["lf", "crlf"])
def test_the_scan_with_git_finds_what_it_finds_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, before: str, newline: str
) -> None:
    """Lines are numbered by \\n on both ways (git's count), whatever else breaks a line for
    `str.splitlines`; a repository's `grep.column` does not change git's output."""
    package = tmp_path / "repo" / "sglang"
    text = ("import torch\n" + before + "\n" + GATE).replace("\n", newline)
    (package / "srt").mkdir(parents=True)
    (package / "srt" / "a.py").write_bytes(text.encode())
    subprocess.run(["git", "init", "-q", str(tmp_path / "repo")], check=True)
    subprocess.run(
        ["git", "-C", str(tmp_path / "repo"), "config", "grep.column", "true"], check=True
    )
    source = Source(package)
    helpers = devices.helpers_of(source)
    if scanner._GitGrep(source).files() is None:
        pytest.skip("no git here")
    with_git = scanner.scan(source, helpers)
    monkeypatch.setenv("PATH", "")
    assert scanner._GitGrep(source).files() is None
    without = scanner.scan(Source(package), helpers)
    assert with_git == without
    assert [f.line for f in with_git] == [text.count("\n", 0, text.index("if torch")) + 1]


def test_git_grep_that_names_files_from_the_repository_top_is_not_used(tmp_path: Path) -> None:
    """grep.fullName (an editable checkout's repository may set it) or an old git that reads
    the user's config: names not relative to the package mean git's answer is dropped."""
    package = tmp_path / "repo" / "python" / "sglang"
    write(package / "srt" / "a.py", "if is_sm100_supported():\n    a = 1\n")
    write(package / "srt" / "b.py", "a = 1\n")
    repo = tmp_path / "repo"
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(["git", "-C", str(repo), "config", "grep.fullName", "true"], check=True)
    grep = scanner._GitGrep(Source(package))
    found = grep.files()  # --no-full-name wins over the repository's config
    assert found == {"srt/a.py": [(1, b"if is_sm100_supported():")]}
    assert scanner._GitGrep(Source(package)).root == package
    grep = scanner._GitGrep(Source(package))
    assert grep.process is not None
    grep.root = tmp_path  # as if git had named the files from somewhere else
    assert grep.files() is None
    grep = scanner._GitGrep(Source(package))
    grep.root = tmp_path
    assert grep.files({"srt/b.py"}) is None  # the listing names other files: still looked up
    grep = scanner._GitGrep(Source(package))
    grep.root = tmp_path
    assert grep.files({"srt/a.py"}) == found  # a file the listing found is not looked up again


@pytest.mark.wheel
@needs_pool
def test_a_scan_whose_pool_cannot_start_runs_here(
    trees: dict[str, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    source = Source(trees[SEED] / "sglang")
    expected = scanner.scan(source, devices.helpers_of(source))

    def no_process(*args: object, **kwargs: object) -> None:
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(pool, "ProcessPoolExecutor", no_process)
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is None
        assert shared.result() == expected


@pytest.mark.wheel
@needs_pool
def test_a_scan_whose_workers_die_finishes_in_the_caller(trees: dict[str, Path]) -> None:
    source = Source(trees["0.5.23"] / "sglang")
    expected = scanner.scan(source, devices.helpers_of(source))
    with pool.Pool() as workers:
        shared = started_scan(source, workers)
        assert workers.executor is not None
        for process in workers.executor._processes.values():
            os.kill(process.pid, signal.SIGKILL)  # BrokenProcessPool: the rest is scanned here
        assert shared.result() == expected


@pytest.mark.wheel
@needs_pool
def test_a_scan_left_early_stops_its_workers(trees: dict[str, Path]) -> None:
    source = Source(trees[SEED] / "sglang")
    with pytest.raises(KeyError), pool.Pool() as workers:  # the work beside the scan raised
        started_scan(source, workers)
        assert workers.executor is not None
        processes = list(workers.executor._processes.values())
        raise KeyError("the EAGLE-3 side")
    assert workers.executor is None
    assert not any(_alive(p.pid) for p in processes)


def _alive(pid: int) -> bool:
    """Still running, or a zombie nobody reaped."""
    try:
        return os.waitpid(pid, os.WNOHANG) == (0, 0)
    except ChildProcessError:
        return False
