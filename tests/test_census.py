"""The start-up resolution the census and `doctor --all-models` share (`sglpatch.doctor.resolve`)
on real releases: it finds known gaps, stops finding them once the catalogue's patch is applied
in memory, gives 10.0 what the code gives 10.0; and the census document (scripts/sm120_census.py)
is doctor's rows."""

from __future__ import annotations

import importlib
import re
from functools import cache
from types import ModuleType

import pytest
from packaging.version import Version

from sglpatch import catalogue
from sglpatch.doctor.facts import kernel_support as support
from tests.support import census, wheels
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel


@cache
def script() -> ModuleType:
    module = importlib.import_module("scripts.sm120_census")
    module._quiet()
    return module


def _choice(outcome: census.Outcome, field: str) -> str:
    assert outcome.not_evaluated is None and outcome.refused is None, outcome
    return {f: v for _, f, v in outcome.choices}[field]


@cache
def _replaced(release: str, patch_id: str) -> dict[str, bytes]:
    """The file the catalogue's `patch_id` changes on `release`, as `apply` leaves it."""
    (patch,) = [p for p in catalogue.load() if p.id == patch_id]
    path = f"sglang/{patch.target_file(Version(release))}"
    return {path: wheels.patched(release, patch=patch)}


KNOWN = [  # (architecture, quantization, kind, field, what 12 gets, the patch, what it gets then)
    ("Olmo2ForCausalLM", "bf16", "attention", "attention_backend", "fa3",
     "sm120-olmo-fa3-fallback", "triton"),
    ("GptOssForCausalLM", "mxfp4", "moe", "moe_runner_backend", "flashinfer_mxfp4",
     "sm120-mxfp4-moe-backend", "triton_kernel"),
]  # fmt: skip


@pytest.mark.parametrize("known", KNOWN, ids=[k[0] for k in KNOWN])
@pytest.mark.parametrize("capability", [(12, 0), (12, 1)], ids=str)
def test_a_known_gap_is_found_and_gone_once_patched(
    known: tuple[str, str, str, str, str, str, str], capability: tuple[int, int]
) -> None:
    arch, quant, kind, field, unpatched, patch_id, patched = known
    script()
    got = _choice(census.Release(SEED, capability).evaluate(arch, quant), field)
    assert got == unpatched
    assert support.runs_on(kind, got, capability, release=SEED) is False
    fixed = census.Release(SEED, capability, _replaced(SEED, patch_id)).evaluate(arch, quant)
    assert _choice(fixed, field) == patched
    assert support.runs_on(kind, patched, capability, release=SEED) is True


def test_capability_10_gets_what_the_code_gives_it() -> None:
    script()
    blackwell = census.Release(SEED, (10, 0))
    gpt_oss = blackwell.evaluate("GptOssForCausalLM", "mxfp4")
    assert _choice(gpt_oss, "attention_backend") == "trtllm_mha"
    assert _choice(gpt_oss, "moe_runner_backend") == "flashinfer_mxfp4"
    assert _choice(blackwell.evaluate("DeepseekV3ForCausalLM", "fp8"), "attention_backend") == (
        "trtllm_mla"
    )
    # The same model on 12.0 takes the release's other branch.
    assert _choice(census.Release(SEED, (12, 0)).evaluate("GptOssForCausalLM", "mxfp4"),
                   "attention_backend") == "triton"  # fmt: skip


def test_a_stand_in_the_code_decides_with_is_reported_not_guessed() -> None:
    script()
    outcome = census.Release(SEED, (12, 0)).evaluate("Exaone4ForCausalLM", "bf16")
    assert outcome.choices == () and "sliding_window_pattern" in (outcome.not_evaluated or "")


def test_the_document_is_doctors_rows_for_the_seed_release() -> None:
    """The census is `doctor --all-models` on the wheel: its seed section is those rows."""
    module = script()
    text = module.OUT.read_text()
    listed = re.search(r"^Releases: (.*)\.$", text, re.M)
    assert listed is not None and SEED in listed.group(1).split(", ")
    rows = module.rows(SEED)
    fresh = module.document([SEED], {SEED: rows})
    counts = next(line for line in fresh.splitlines() if line.startswith(f"| {SEED} |"))
    assert counts in text.splitlines()
    section = "\n".join(module.section(SEED, rows))
    assert section in text
    assert "sm120-mxfp4-moe-backend" in section and "GptOssForCausalLM" in section


def test_the_census_names_what_sglpatch_list_applies() -> None:
    """The census, doctor and `sglpatch list` agree: every patch a release's section of the
    document names is one `sglpatch list --release R` says applies to R."""
    import json

    from typer.testing import CliRunner

    from sglpatch.cli import app

    text = script().OUT.read_text()
    known = {patch.id for patch in catalogue.load()}
    checked = 0
    for section in re.split(r"^## ", text, flags=re.M):
        release = section.split("\n", 1)[0].strip()
        if not re.fullmatch(r"\d+\.\d+\.\d+(?:\.post\d+)?", release):
            continue
        named = {word for word in re.findall(r"[a-z0-9]+(?:-[a-z0-9]+)+", section) if word in known}
        listed = json.loads(
            CliRunner().invoke(app, ["list", "--release", release, "--json"]).stdout
        )["patches"]
        applies = {p["id"] for p in listed if p["effect"] == "applies"}
        assert named <= applies, (release, named - applies)
        checked += len(named)
    assert checked, "the document names no patch: the test proves nothing"
