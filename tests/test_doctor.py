"""doctor on the real wheels: what it derives, what it finds, and that apply clears it."""

from __future__ import annotations

import json
import shutil
import textwrap
from pathlib import Path

import pytest
from packaging.version import Version
from typer.testing import CliRunner

from sglpatch import api, capability_gaps, catalogue, doctor
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from sglpatch.source_tree import Source
from tests import wheels

KIMI = "KimiK25ForConditionalGeneration"
TABLES = {
    "sglang/srt/distributed/device_communicators/all_reduce_utils.py": "sm120-symm-mem-sizes",
    "sglang/srt/distributed/device_communicators/torch_symm_mem.py": "sm120-symm-mem-two-shot",
}


@pytest.fixture(scope="module")
def tree_059(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.full_tree("0.5.9", tmp_path_factory.mktemp("doctor") / "site")


def run_doctor(runner: CliRunner, site: Path, *args: str) -> tuple[int, dict[str, object]]:
    result = runner.invoke(app, ["doctor", "--target", str(site), "--json", *args])
    return result.exit_code, json.loads(result.stdout)


@pytest.mark.wheel
def test_0_5_9_kimi_lacks_the_interface_and_the_tables_lack_12(
    runner: CliRunner, tree_059: Path
) -> None:
    code, report = run_doctor(runner, tree_059)
    assert code == ExitCode.GAPS
    assert report["release"] == "0.5.9"
    eagle3 = report["eagle3"]
    assert eagle3["required"] == ["get_embed_and_head", "set_eagle3_layers_to_capture"]
    assert any(
        "speculative/eagle_worker.py" in place
        for place in eagle3["called_at"]["get_embed_and_head"]
    )
    models = eagle3["models"]
    assert models[KIMI] == {
        "module": "sglang/srt/models/kimi_k25.py",
        "missing": ["get_embed_and_head", "set_eagle3_layers_to_capture"],
        "fixed_by": "kimi-k25-eagle3-interface",
    }
    assert models["DeepseekV3ForCausalLM"]["missing"] == []  # through DeepseekV2ForCausalLM
    tables = {g["file"]: g for g in report["capability_gaps"] if g["kind"] == "table"}
    for file, patch_id in TABLES.items():
        assert tables[file]["covered_by"] == patch_id
    gates = [g for g in report["capability_gaps"] if g["kind"] == "gate"]
    # The doctor credits a gap to the patch that edits its file, whatever the line: the FA3
    # gate in attention_registry.py is credited to the hybrid-GDN patch, which edits that file.
    edited = {
        f"sglang/{path}": p.id
        for p in catalogue.load()
        if (path := p.target_file(Version("0.5.9"))) and not p.fixed_upstream(Version("0.5.9"))
    }
    assert gates and all(g["covered_by"] == edited.get(g["file"]) for g in gates)
    assert any(g["covered_by"] is None for g in gates)
    assert all(isinstance(g["line"], int) and g["code"] for g in report["capability_gaps"])


@pytest.mark.wheel
def test_after_apply_those_gaps_are_gone(runner: CliRunner, tree_059: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(tree_059, site)
    assert runner.invoke(app, ["apply", "--target", str(site)]).exit_code == 0
    _, report = run_doctor(runner, site)
    assert report["eagle3"]["models"][KIMI]["missing"] == []
    assert not {g["file"] for g in report["capability_gaps"]} & set(TABLES)
    _, narrowed = run_doctor(runner, site, "--model", "kimi_k25")
    assert list(narrowed["eagle3"]["models"]) == [KIMI]


@pytest.mark.wheel
def test_0_5_10_kimi_is_complete(tmp_path: Path) -> None:
    site = wheels.full_tree("0.5.10", tmp_path / "site")
    report = api.diagnose(site, "kimi_k25")
    (kimi,) = report.diagnosis.models
    assert kimi.name == KIMI and kimi.missing == () and kimi.fixed_by is None


@pytest.mark.wheel
def test_a_new_call_in_the_worker_is_a_new_requirement(tree_059: Path, tmp_path: Path) -> None:
    site = tmp_path / "site"
    shutil.copytree(tree_059, site)
    worker = site / "sglang" / "srt" / "speculative" / "eagle_worker.py"
    source = worker.read_text()
    anchor = "        embed, head = self.target_worker.model_runner.model.get_embed_and_head()\n"
    assert anchor in source
    worker.write_text(
        source.replace(
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
    assert "get_draft_vocab_map" in found.models[0].missing
    deepseek = api.diagnose(site, "deepseek_v2").diagnosis
    assert all("get_draft_vocab_map" in m.missing for m in deepseek.models)


def test_an_unknown_model_module_is_a_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    site = tmp_path / "site"
    (site / "sglang" / "srt" / "models").mkdir(parents=True)
    (site / "sglang" / "__init__.py").write_text("")
    result = runner.invoke(app, ["doctor", "--target", str(site), "--model", "nope"])
    assert result.exit_code == ExitCode.USAGE and "nope" in result.stderr


def test_a_healthy_tree_exits_zero(runner: CliRunner, tmp_path: Path) -> None:
    package = tmp_path / "site" / "sglang"
    write(package / "__init__.py", "")
    write(
        package / "srt" / "speculative" / "eagle_worker.py",
        """
        class EAGLEWorker:
            def init(self):
                embed, head = self.target_worker.model_runner.model.get_embed_and_head()
    """,
    )
    write(
        package / "srt" / "models" / "tiny.py",
        """
        class Base:
            def get_embed_and_head(self):
                return 1, 2

        class Tiny(Base):
            pass

        EntryClass = Tiny
    """,
    )
    result = runner.invoke(app, ["doctor", "--target", str(tmp_path / "site")])
    assert result.exit_code == 0, result.stdout
    assert "Nothing: no gaps found." in result.stdout


def write(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text))


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        ("if torch.cuda.get_device_capability()[0] == 10:\n    pass\n", "gate"),
        ("ok = self.device_capability != 9\n", "gate"),
        ("ok = compute_capability in (9, 10)\n", "gate"),
        ("ok = get_device_capability()[0] not in (\n    9,\n    10,\n)\n", "gate"),
        ("ok = torch.cuda.get_device_capability() == (9, 0)\n", "gate"),
        ("ok = major == 10\n", "gate"),
        ("SIZES = {9: 1, 10: 2}\nx = SIZES[capability]\n", "table"),
        ("ok = compute_capability >= 9\n", None),  # admits 12
        ("ok = compute_capability in (9, 10, 12)\n", None),
        ("ok = CUDA_CAPABILITY[1] == 9\n", None),  # a minor version
        ("SIZES = {9: 1, 10: 2, 12: 3}\n", None),
        ("SIZES = {9: 1, 10: 2}\nx = SIZES.get(capability, 0)\n", None),  # tolerant lookup
        ("WORLD = {2: 1, 4: 2, 8: 3}\n", None),  # world sizes, not majors
    ],
)
def test_capability_gap_shapes(tmp_path: Path, code: str, kind: str | None) -> None:
    package = tmp_path / "sglang"
    write(package / "mod.py", "# the device's capability\n" + code)
    gaps = capability_gaps.find(Source(package))
    assert [g[2] for g in gaps] == ([kind] if kind else [])
    if kind:
        assert gaps[0][0] == "sglang/mod.py" and gaps[0][1] >= 2


def test_covered_by_names_the_patch_for_that_file(tmp_path: Path) -> None:
    package = tmp_path / "sglang"
    write(
        package / "srt/distributed/device_communicators/all_reduce_utils.py",
        "T = {9: 1, 10: 2}\nT[x]\n",
    )
    found = doctor.diagnose(package, Version("0.5.9"), catalogue.load())
    assert [(g.kind, g.covered_by) for g in found.gaps] == [("table", "sm120-symm-mem-sizes")]
    upstream = doctor.diagnose(package, Version("0.5.30"), catalogue.load())
    assert upstream.gaps[0].covered_by == "sm120-symm-mem-sizes"
