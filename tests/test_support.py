"""The kernel-support table: well-formed, answered through its API, and kept in step with the
releases' own choices lists and assertions (read from the real wheels)."""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from importlib import resources

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.doctor.facts import kernel_support as support
from tests.support import syntax, wheels
from tests.support.releases import RELEASES

SCRIPT = wheels.REPO / "scripts" / "kernel_support_doc.py"
# The releases whose choices the table must cover: the oldest it judges, one from the middle
# (the only one of these with `--fp4-gemm-backend cutlass`), the newest.
CHOICE_RELEASES = ("0.5.9", "0.5.12", "0.5.23")
JUDGED = [r for r in RELEASES if Version(r) >= Version("0.5.9")]


def _raw() -> dict[str, object]:
    raw: dict[str, object] = json.loads(
        resources.files("sglpatch.doctor.facts").joinpath("kernel_support.json").read_text()
    )
    return raw


# --- the file ----------------------------------------------------------------------------------


def test_every_record_is_well_formed() -> None:
    records = support.table()
    assert len(records) >= 40
    for (kind, name), record in records.items():
        assert kind in support.KINDS and (record.kind, record.name) == (kind, name)
        for variant in support.variants(kind, name):
            assert variant.source.strip(), (kind, name)
            for spans in (variant.runs_on, variant.unknown_on):
                assert list(spans) == sorted(spans), (kind, name)
        if kind == "gemm":
            assert name.partition(":")[0] in support.GEMM_FLAGS, name


def test_no_choice_is_both_judged_and_not_judged() -> None:
    assert not set(support.table()) & set(support.not_judged())
    assert all(reason.strip() for reason in support.not_judged().values())


def test_earlier_readings_are_disjoint_and_older_than_the_newest() -> None:
    """Each judged release gets at most one earlier reading, and the newest release none."""
    for kind, name in support.table():
        earlier = support.variants(kind, name)[:-1]
        for release in JUDGED:
            holding = [v for v in earlier if Version(release) in SpecifierSet(v.sglang or "")]
            assert len(holding) <= 1, (kind, name, release)
        assert all(Version(RELEASES[-1]) not in SpecifierSet(v.sglang or "") for v in earlier)


@pytest.mark.parametrize(
    "broken, message",
    [
        ({"runs_on": [["9.0", "8.0"]]}, "runs backwards"),
        ({"runs_on": [["10.0", None], ["12.0", "12.1"]]}, "out of order"),
        ({"runs_on": [["9.0", None]], "unknown_on": [["12.1", "12.1"]]}, "both in runs_on"),
        ({"source": ""}, "no source"),
        ({"kind": "linear"}, "bad or repeated"),
        ({"earlier": [{"runs_on": [], "source": "x"}]}, "valid 'sglang'"),
    ],
)
def test_a_broken_record_is_refused(
    broken: dict[str, object], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    good = {"kind": "attention", "name": "x", "runs_on": [["9.0", "9.0"]], "source": "s"}
    monkeypatch.setattr(
        support, "_raw", lambda: {"backends": [{**good, **broken}], "not_judged": []}
    )
    support._variants.cache_clear()
    try:
        with pytest.raises(ValueError, match=message):
            support._variants()
    finally:
        support._variants.cache_clear()


# --- the API -----------------------------------------------------------------------------------


def test_the_api_answers_true_false_and_none() -> None:
    assert support.runs_on("attention", "fa3", (9, 0)) is True
    assert support.runs_on("attention", "fa3", (12, 0)) is False
    assert support.runs_on("attention", "trtllm_mla", (12, 0)) is None  # unknown_on
    assert support.runs_on("attention", "no_such_backend", (12, 0)) is None
    assert support.lookup("attention", "no_such_backend") is None
    assert support.runs_on("attention", "triton", (12, 1)) is True
    assert support.runs_on("comm", "torch_symm_mem", (12, 0)) is False
    assert support.runs_on("moe", "flashinfer_trtllm", (10, 3)) is True
    assert support.runs_on("moe", "flashinfer_trtllm", (12, 0)) is False
    assert support.runs_on("gemm", support.gemm_name("fp4", "flashinfer_cutlass"), (12, 1)) is True
    with pytest.raises(ValueError):
        support.gemm_name("bf16", "cutlass")


def test_a_release_picks_the_reading_that_holds_for_it() -> None:
    # trtllm_mha: 0.5.9 refuses anything but SM100; 0.5.10 sends 9.0 and 12.x to FlashInfer XQA.
    assert support.runs_on("attention", "trtllm_mha", (12, 0), "0.5.9") is False
    assert support.runs_on("attention", "trtllm_mha", (12, 0), "0.5.10") is True
    assert support.runs_on("attention", "trtllm_mha", (12, 0)) is True  # the newest reading
    # fa4 on 12: no through 0.5.17 (no SM120 path, then no paged KV on 12), SGLang's own SM120
    # port from 0.5.18; 9.0 unread for the flash-attn-4 package releases.
    assert support.runs_on("attention", "fa4", (12, 0), "0.5.9") is False
    assert support.runs_on("attention", "fa4", (12, 0), "0.5.12") is False
    assert support.runs_on("attention", "fa4", (9, 0), "0.5.12") is None
    assert support.runs_on("attention", "fa4", (12, 1), "0.5.17") is False
    assert support.runs_on("attention", "fa4", (12, 1), "0.5.18") is True
    assert support.lookup("attention", "fa4", "0.5.18") == support.table()["attention", "fa4"]


def test_shown_range() -> None:
    assert support.lookup("attention", "fa3").shown_range() == "8.0-9.0"  # type: ignore[union-attr]
    assert support.lookup("attention", "triton").shown_range() == "7.5+"  # type: ignore[union-attr]
    assert support.lookup("attention", "aiter").shown_range() == "nothing"  # type: ignore[union-attr]


# --- the document ------------------------------------------------------------------------------


def test_the_document_is_up_to_date() -> None:
    # As the document's header says to run it: the file, from the repository's root.
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--check"],
        capture_output=True,
        text=True,
        check=False,
        cwd=wheels.REPO,
    )
    assert result.returncode == 0, result.stderr


def test_the_document_shows_every_record_and_every_not_judged_choice() -> None:
    text = (wheels.REPO / "docs" / "kernel-support.md").read_text(encoding="utf-8")
    for kind, name in [*support.table(), *support.not_judged()]:
        assert re.search(rf"^\| {kind} \| `{re.escape(name)}`", text, re.M), (kind, name)
    assert "| attention | `fa3` | no | no | no | runs |" in text


# --- against the releases ----------------------------------------------------------------------

_NON_CUDA = {"aiter", "wave", "intel_amx", "ascend", "intel_xpu"}
_DSA_FIELDS = {
    "nsa_prefill_backend",
    "nsa_decode_backend",
    "dsa_prefill_backend",
    "dsa_decode_backend",
}


def _choices(release: str) -> dict[str, set[str]]:
    """Each kind's choices as the release's own flags spell them (module-level *_CHOICES lists,
    and from 0.5.19 the DSA fields' inline `choices=[...]`)."""
    lists: dict[str, list[str]] = {}
    dsa_inline: set[str] = set()
    for name in wheels.members(release, "sglang/srt/"):
        if not name.endswith(".py") or not (
            name == "sglang/srt/server_args.py" or name.startswith("sglang/srt/arg_groups/")
        ):
            continue
        tree = syntax.tree(wheels.member(release, name))
        for node in ast.walk(tree):
            if isinstance(node, ast.Assign) and len(node.targets) == 1:
                target = node.targets[0]
                if isinstance(target, ast.Name) and target.id.endswith("_CHOICES"):
                    if isinstance(node.value, ast.List):
                        lists[target.id] = [
                            e.value
                            for e in node.value.elts
                            if isinstance(e, ast.Constant) and isinstance(e.value, str)
                        ]
                    elif isinstance(node.value, ast.Name):  # NSA_CHOICES = DSA_CHOICES
                        lists[target.id] = lists.get(node.value.id, [])
            if (
                isinstance(node, ast.AnnAssign)
                and isinstance(node.target, ast.Name)
                and node.target.id in _DSA_FIELDS
            ):
                for keyword in ast.walk(node.annotation):
                    if (
                        isinstance(keyword, ast.keyword)
                        and keyword.arg == "choices"
                        and isinstance(keyword.value, ast.List)
                    ):
                        dsa_inline |= set(ast.literal_eval(keyword.value))
    return {
        "attention": set(lists["ATTENTION_BACKEND_CHOICES"]),
        "dsa": set(lists.get("DSA_CHOICES") or lists.get("NSA_CHOICES") or []) | dsa_inline,
        "moe": set(lists["MOE_RUNNER_BACKEND_CHOICES"]),
        "gemm": {f"fp8:{c}" for c in lists.get("FP8_GEMM_RUNNER_BACKEND_CHOICES", [])}
        | {f"fp4:{c}" for c in lists.get("FP4_GEMM_RUNNER_BACKEND_CHOICES", [])},
    }


@pytest.fixture(scope="module")
def offered() -> dict[str, dict[str, set[str]]]:
    return {release: _choices(release) for release in CHOICE_RELEASES}


@pytest.mark.wheel
def test_the_reader_finds_each_kinds_choices(offered: dict[str, dict[str, set[str]]]) -> None:
    assert {"fa3", "trtllm_mha", "cutlass_mla"} <= offered["0.5.9"]["attention"]
    assert "cutlass_mla" not in offered["0.5.23"]["attention"]
    assert {"flashmla_sparse", "tilelang", "trtllm"} <= offered["0.5.9"]["dsa"]
    assert {"flashinfer_sparse_mla", "triton_sparse_mla"} <= offered["0.5.23"]["dsa"]
    assert (
        "fp4:cutlass" in offered["0.5.12"]["gemm"]
        and "fp4:cutlass" not in offered["0.5.23"]["gemm"]
    )


@pytest.mark.wheel
def test_every_name_in_the_table_is_a_choice_a_release_offers(
    offered: dict[str, dict[str, set[str]]],
) -> None:
    for kind, name in [*support.table(), *support.not_judged()]:
        if kind == "comm":  # all-reduce paths are switches, not the values of one flag
            continue
        assert any(name in choices[kind] for choices in offered.values()), (kind, name)


@pytest.mark.wheel
def test_every_choice_the_releases_offer_is_judged_or_listed_not_judged(
    offered: dict[str, dict[str, set[str]]],
) -> None:
    known = set(support.table()) | set(support.not_judged())
    missing = sorted(
        (release, kind, name)
        for release, kinds in offered.items()
        for kind, names in kinds.items()
        for name in names
        if (kind, name) not in known and name not in _NON_CUDA
    )
    assert not missing, f"choices the table neither judges nor lists as not judged: {missing}"
    for kind, name in known:  # the non-CUDA names must still be in the table
        assert name.partition(":")[2] not in _NON_CUDA or (kind, name) in support.table()


def _source(release: str, path: str) -> str:
    return wheels.member(release, path).decode()


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.16", "0.5.23"])
def test_fa3_agrees_with_the_releases_own_assertion(release: str) -> None:
    text = _source(release, "sglang/srt/layers/attention/attention_registry.py")
    found = re.search(r"FlashAttention v3 Backend requires SM>=(\d)(\d) and SM<=(\d)(\d)", text)
    assert found is not None
    low_cap, high_cap = (int(found[1]), int(found[2])), (int(found[3]), int(found[4]))
    for capability in [(8, 0), (9, 0), (10, 0), (12, 0), (12, 1)]:
        inside = low_cap <= capability <= high_cap
        assert support.runs_on("attention", "fa3", capability, release) is inside, capability


@pytest.mark.wheel
@pytest.mark.parametrize("release", ["0.5.9", "0.5.23"])
def test_torch_symm_mem_agrees_with_the_releases_size_table(release: str) -> None:
    path = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
    tree = syntax.tree(_source(release, path))
    majors = next(
        {key.value for key in node.value.keys if isinstance(key, ast.Constant)}
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign)
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
        and isinstance(node.value, ast.Dict)
    )
    record = support.lookup("comm", "torch_symm_mem", release)
    assert record is not None
    assert {span.low[0] for span in record.runs_on} == majors


@pytest.mark.wheel
def test_trtllm_mha_agrees_with_each_releases_gate() -> None:
    old = _source("0.5.9", "sglang/srt/server_args.py")
    assert "TRTLLM MHA backend is only supported on Blackwell GPUs (SM100)" in old
    assert support.lookup("attention", "trtllm_mha", "0.5.9").runs_on == (  # type: ignore[union-attr]
        support.Span((10, 0), (10, 3)),
    )
    for release in ("0.5.10", "0.5.23"):
        new = _source(release, "sglang/srt/layers/attention/trtllm_mha_backend.py")
        assert re.search(r"is_xqa_impl = .*sm90.*sm120", new), release
        assert all(
            support.runs_on("attention", "trtllm_mha", c, release) for c in [(9, 0), (12, 0)]
        )


@pytest.mark.wheel
def test_fa4_agrees_with_each_releases_kernels() -> None:
    vendored = _source("0.5.9", "sglang/jit_kernel/flash_attention/cute/interface.py")
    assert "assert compute_capability in [9, 10, 11]" in vendored
    assert "paged KV not supported on SM 9.0" in vendored
    assert support.runs_on("attention", "fa4", (12, 0), "0.5.9") is False
    assert support.runs_on("attention", "fa4", (9, 0), "0.5.9") is False
    backend = _source("0.5.18", "sglang/srt/layers/attention/flashattention_backend.py")
    assert "flash_attention_v4_sm120" in backend and "device_capability[0] == 12" in backend
    assert "flash_attention_v4_sm120" not in _source(
        "0.5.17", "sglang/srt/layers/attention/flashattention_backend.py"
    )


@pytest.mark.wheel
def test_the_floor_and_the_releases_own_comments_agree() -> None:
    choices = _source("0.5.23", "sglang/srt/arg_groups/choices.py")
    assert (
        '"hpc_ops",  # HPC-Ops (https://github.com/Tencent/hpc-ops), Hopper (SM90) only' in choices
    )
    assert support.lookup("attention", "hpc_ops").runs_on == (support.Span((9, 0), (9, 0)),)  # type: ignore[union-attr]
    fields = _source("0.5.23", "sglang/srt/arg_groups/fields/exec_.py")
    assert "'marlin' (weight-only W4A16 fallback for SM80+)" in fields
    assert "flashinfer_cutlass otherwise (including SM120)" in fields
    for name in ("fp4:marlin", "fp4:flashinfer_cutlass"):
        assert support.runs_on("gemm", name, (12, 0)) and support.runs_on("gemm", name, (12, 1))
    assert support.lookup("gemm", "fp4:marlin").runs_on[0].low == (8, 0)  # type: ignore[union-attr]
    runner = _source("0.5.9", "sglang/srt/model_executor/model_runner.py")
    assert "SGLang only supports sm75 and above." in runner
    assert support.lookup("attention", "triton").runs_on[0].low == (7, 5)  # type: ignore[union-attr]
    configurer = _source("0.5.13", "sglang/srt/layers/deep_gemm_wrapper/configurer.py")
    assert "not available on SM120" in configurer
    assert support.runs_on("moe", "deep_gemm", (12, 0), "0.5.13") is False
