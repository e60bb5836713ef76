"""How doctor judges the path to a decision: the `if`s around it, the opt-in flag it needs, what
12 loses there, and tables read from another module."""

from __future__ import annotations

from pathlib import Path

import pytest

from sglpatch.doctor import judged
from sglpatch.doctor.facts import kernel_support as support
from sglpatch.doctor.gates import devices, scanner, tables

HELPERS = devices.KNOWN_HELPERS
IMPORTS = "from sglang.srt.utils import get_device_sm, is_blackwell_supported, is_sm100_supported\n"


def _judged(code: str, release: str = "0.5.23") -> list[tuple[judged.Judgement, ...]]:
    found = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/srt/m.py", HELPERS)
    return [judged.judge_all(f, release) for f in found]


# 0.5.23's DSA default, shaped like `arg_groups/overrides.py`: the bfloat16 arm's decode choice.
DSA = """\
def defaults(declared, kv_cache_dtype, is_hip):
    major, _ = get_device_capability()
    if is_hip:
        declared["dsa_decode_backend"] = "triton"
{arm}    elif kv_cache_dtype == "fp8_e4m3":
        declared["dsa_prefill_backend"] = "flashmla_kv"
    else:
        declared["dsa_decode_backend"] = "trtllm" if major >= 10 else "fa3"
"""
TWELVE = '    elif major == 12:\n        declared["dsa_decode_backend"] = "tilelang"\n'


def test_a_decision_after_an_arm_that_takes_12_is_not_12s() -> None:
    (before,) = _judged(DSA.format(arm=""))
    assert [j.outcome for j in before] == [judged.FAILS, judged.FAILS]
    assert "trtllm (dsa" in before[0].what
    # The else arm needs another KV dtype than the FP8 one: --kv-cache-dtype, the user's flag.
    assert before[0].opt_in == "kv_cache_dtype != 'fp8_e4m3'"
    after = _judged(DSA.format(arm=TWELVE))
    assert all("trtllm" not in j.what for found in after for j in found)


def test_a_decision_inside_an_if_12_cannot_enter_is_not_reported() -> None:
    code = (
        "def f(self):\n"
        "    if is_sm100_supported():\n"
        '        self.attention_backend = "trtllm_mha" if get_device_sm() >= 100 else "fa3"\n'
    )

    def lines(text: str) -> list[int]:
        found = scanner.scan_bytes((IMPORTS + text).encode(), "sglang/srt/m.py", HELPERS)
        return [f.line for f in found]

    assert lines(code) == [3]  # the outer `if` alone (12 skips it); not line 4 inside it
    entered = code.replace("is_sm100_supported()", "is_blackwell_supported()")
    assert 4 in lines(entered)
    inner = [j for found in _judged(entered, "0.5.9") for j in found if "trtllm_mha" in j.what]
    assert inner and inner[0].outcome == judged.FAILS  # trtllm_mha does not run on 0.5.9's 12


def test_a_path_only_an_unrunnable_backend_flag_leads_to_is_harmless() -> None:
    code = (
        "def f(self, decode_backend):\n"
        "    if decode_backend == {name!r}:\n"
        '        self.decode_attention_backend = "flashinfer" if is_sm100_supported() else "triton"\n'
    )
    ((fa3, _),) = _judged(code.format(name="fa3"))
    assert fa3.outcome == judged.HARMLESS  # fa3 does not run on 12: no working run gets there
    ((flashinfer, _),) = _judged(code.format(name="flashinfer"))
    assert (
        flashinfer.outcome == judged.LOSES and flashinfer.opt_in == "decode_backend == 'flashinfer'"
    )


def test_a_loss_where_12_chooses_nothing_is_not_judged() -> None:
    code = 'def f(self):\n    if is_sm100_supported():\n        self.attention_backend = "triton"\n'
    ((judgement, _),) = _judged(code)
    assert judgement.outcome == judged.NOT_JUDGED
    assert "choosing nothing here" in judgement.what and "10 gets triton" in judgement.what


@pytest.mark.parametrize(
    ("lost", "verdict"), [("trtllm_mha", judged.NOT_JUDGED), ("flashinfer", judged.LOSES)]
)
def test_a_loss_of_a_backend_that_is_another_kernel_on_12_is_not_judged(
    lost: str, verdict: str
) -> None:
    code = (
        "def f(self):\n"
        f'    self.attention_backend = "{lost}" if is_sm100_supported() else "triton"\n'
    )
    ((judgement, _),) = _judged(code)
    assert judgement.outcome == verdict
    if verdict == judged.NOT_JUDGED:
        assert "XQA" in judgement.what and "not established" in judgement.what


def test_the_table_marks_the_ported_backends() -> None:
    twelve = (12, 0)
    for kind, name in (
        ("attention", "trtllm_mha"),
        ("attention", "fa4"),
        ("moe", "flashinfer_mxfp4"),
    ):
        record = support.lookup(kind, name, release="0.5.23")
        assert record is not None and record.runs(twelve) and record.ported(twelve), name
        assert not record.ported((10, 0))
    old = support.lookup("moe", "flashinfer_mxfp4", release="0.5.16")
    assert old is not None and not old.runs(twelve) and not old.ported(twelve)
    for name in ("triton", "flashinfer"):
        record = support.lookup("attention", name, release="0.5.23")
        assert record is not None and not record.ported(twelve)


def _tables(code: str) -> list[str]:
    found = scanner.scan_bytes(code.encode(), "sglang/srt/t.py", HELPERS)
    return [f.gets for f in found if f.kind == "table"]


def test_a_table_read_tolerantly_is_not_reported() -> None:
    table = "SIZES = {9: 1, 10: 2}\n"
    assert _tables(table + "def f(m):\n    return SIZES[m]\n") == ["KeyError: 12"]
    assert _tables(table + "def f(m):\n    return SIZES.get(m)\n") == []
    assert _tables(table + "def f(m):\n    return SIZES.get(m, 0)\n") == []
    assert _tables(table + "def f(m):\n    return m not in SIZES\n") == []
    assert _tables(table) == ["no row"]


@pytest.mark.parametrize(
    ("reader", "expected"),
    [
        ("from .sizes import SIZES\nx = SIZES[major]\n", "KeyError: 12"),
        ("from .sizes import SIZES\nx = SIZES.get(major)\n", None),
        ("print('no reader')\n", "no row"),
    ],
)
def test_a_table_is_judged_by_the_module_beside_it_that_reads_it(
    tmp_path: Path, reader: str, expected: str | None
) -> None:
    folder = tmp_path / "sglang" / "srt" / "comm"
    folder.mkdir(parents=True)
    (folder / "sizes.py").write_text("SIZES = {\n    9: 1,\n    10: 2,\n}\n")
    (folder / "user.py").write_text(reader)
    (finding,) = [
        f
        for f in scanner.scan_bytes(
            (folder / "sizes.py").read_bytes(), "sglang/srt/comm/sizes.py", HELPERS
        )
        if f.kind == "table"
    ]
    judged_beside = tables.beside(finding, tmp_path / "sglang")
    assert (judged_beside.gets if judged_beside else None) == expected


FP8 = """\
def _dispatch_auto_backend():
    if ENABLE_JIT_DEEPGEMM:
        return deepgemm_w8a8_block_fp8_linear_with_fallback
    elif is_blackwell_supported() and is_flashinfer_available():
        return flashinfer_gemm_w8a8_block_fp8_linear_with_fallback
    return triton_w8a8_block_fp8_linear


def _dispatch_explicit_backend(backend):
    if is_blackwell_supported():
        return flashinfer_gemm_w8a8_block_fp8_linear_with_fallback
"""


def test_a_function_a_patch_keeps_12_out_of_is_covered_then_settled() -> None:
    """sm120-fp8-block-gemm-triton declares `_dispatch_auto_backend` unreached on 12: a decision
    inside it is covered while the patch is pending, and not 12's once it is in; a decision in
    another function of the file is neither."""
    from sglpatch.doctor import unreached
    from sglpatch.doctor.coverage import PatchCheck
    from sglpatch.patches.sm120_fp8_block_gemm_triton import Sm120Fp8BlockGemmTriton
    from sglpatch.results import AlreadyApplied, Applied

    shown = "sglang/srt/layers/quantization/fp8_utils.py"
    data = (IMPORTS + FP8).encode()
    found = scanner.scan_bytes(data, shown, HELPERS)
    inside = [f for f in found if f.line < 10]
    outside = [f for f in found if f.line >= 10]
    assert inside and outside
    patch = Sm120Fp8BlockGemmTriton()
    pending = PatchCheck(patch, shown, Applied(patch.id, shown), b"")
    present = PatchCheck(patch, shown, AlreadyApplied(patch.id, shown, "sglpatch", ""), None)

    def read(name: str) -> bytes | None:
        return data if name == shown else None

    assert unreached.covered(found, [pending], read) == dict.fromkeys(inside, patch.id)
    assert unreached.covered(found, [present], read) == {}
    assert unreached.settled(found, [present], read) == set(inside)
    assert unreached.settled(found, [pending], read) == set()
    other = PatchCheck(patch, "sglang/srt/other.py", Applied(patch.id, shown), b"")
    assert unreached.covered(found, [other], read) == {}


# 0.5.23's default arm: a local chosen by the GPU, handed on to the DSA flags; the KV dtype it
# tests is the one the module gives major >= 10 for `auto` (issue #34's missing default gate).
LOCAL = """\
def defaults(view, declared, user_set):
    major, _ = get_device_capability()
    kv_cache_dtype = view.kv_cache_dtype
    if kv_cache_dtype == "auto":
        kv_cache_dtype = (
            "fp8_e4m3" if major >= 10 and not view.sinks else "bfloat16"
        )
    if kv_cache_dtype == "fp8_e4m3":
        default = "trtllm" if major >= 10 else "flashmla_kv"
        if not user_set:
            declared["dsa_prefill_backend"] = default
    else:
        declared["dsa_decode_backend"] = "trtllm" if major >= 10 else "fa3"
"""


def _by_line(code: str) -> dict[int, list[judged.Judgement]]:
    found = scanner.scan_bytes((IMPORTS + code).encode(), "sglang/srt/m.py", HELPERS)
    return {f.line - 1: list(judged.judge_all(f, "0.5.23")) for f in found}


def test_a_local_chosen_by_the_gpu_is_judged_as_the_flags_it_is_handed_to() -> None:
    found = _by_line(LOCAL)
    default = found[9]  # `default = "trtllm" if major >= 10 ...`
    assert {j.outcome for j in default} == {judged.FAILS}
    assert all("trtllm (dsa, by dsa_prefill_backend)" in j.what for j in default)
    assert all(j.opt_in == "" for j in default)  # 12 gets fp8_e4m3 for `auto`: by default
    # The other arm needs the dtype 12 is not given: the user's --kv-cache-dtype.
    assert all(j.opt_in == "kv_cache_dtype != 'fp8_e4m3'" for j in found[13])
    # Handed to nothing: a local is no choice.
    unused = LOCAL.replace('declared["dsa_prefill_backend"] = default', "pass")
    assert {j.outcome for j in _by_line(unused).get(9, [])} <= {judged.HARMLESS}
    # A module that gives 12 bfloat16 for `auto`: the fp8 arm is the user's choice again.
    bf16 = LOCAL.replace('"fp8_e4m3" if major >= 10', '"fp8_e4m3" if major == 9')
    assert all(j.opt_in == "kv_cache_dtype == 'fp8_e4m3'" for j in _by_line(bf16)[9])


# 0.5.7 - 0.5.9: the fp8_e4m3 arm tests no GPU; the dtype's own default is the gate.
ARM = """\
class ServerArgs:
    def handle(self):
        major, _ = get_device_capability()
        if self.kv_cache_dtype == "auto":
            self.kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"

    def backends(self, kv_cache_dtype, major):
        {twelve}if kv_cache_dtype == "fp8_e4m3":
            self.nsa_prefill_backend = "flashmla_auto"
            self.nsa_decode_backend = "flashmla_kv"
"""
OWN = 'if major == 12:\n            self.nsa_prefill_backend = "tilelang"\n        el'


def test_the_kv_dtype_a_gpu_is_given_is_followed_into_the_arm_that_tests_it() -> None:
    (dtype,) = (j for line, j in _by_line(ARM.format(twelve="")).items() if line == 5)
    assert {j.outcome for j in dtype} == {judged.FAILS}
    assert "flashmla_auto (dsa, by nsa_prefill_backend)" in dtype[0].what
    assert dtype[0].opt_in == ""  # under `== "auto"`: the default
    # An arm 12 takes first (sm120-dsa-backends' shape): the fp8 arm is not 12's.
    patched = _by_line(ARM.format(twelve=OWN))
    assert 8 in patched  # the code parsed: the `major == 12` arm is a decision of its own
    assert {j.outcome for j in patched.get(5, [])} <= {judged.HARMLESS}


# 0.5.10 - 0.5.14 set the default by statements, not a conditional expression.
STATEMENTS = """\
class ServerArgs:
    def handle(self):
        major, _ = get_device_capability()
        if self.kv_cache_dtype == "auto":
            if major >= 10:
                self.kv_cache_dtype = "fp8_e4m3"
            else:
                self.kv_cache_dtype = "bfloat16"

    def backends(self, kv_cache_dtype, major):
        if kv_cache_dtype == "fp8_e4m3":
            if major >= 10:
                self.nsa_prefill_backend = "trtllm"
"""


def test_a_kv_dtype_default_set_by_statements_labels_its_arm_by_default() -> None:
    (arm,) = (j for line, j in _by_line(STATEMENTS).items() if line == 12)
    assert {j.outcome for j in arm} == {judged.FAILS}
    assert all(j.opt_in == "" for j in arm)
    hopper = STATEMENTS.replace("if major >= 10:\n                self.kv", "if major == 9:\n                self.kv")  # fmt: skip
    (opt_in,) = (j for line, j in _by_line(hopper).items() if line == 12)
    assert all(j.opt_in == "kv_cache_dtype == 'fp8_e4m3'" for j in opt_in)
