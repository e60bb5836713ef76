"""GPT-OSS's MXFP4 MoE backend on capability 12: the patched old choice is SGLang 0.5.10's."""

from __future__ import annotations

import ast
import types
from collections.abc import Mapping
from functools import cache

import pytest
from packaging.version import Version

from sglpatch.patches.sm120_mxfp4_moe_backend import TARGET, Sm120Mxfp4MoeBackend
from tests.support import stand_ins_moe as stand_ins
from tests.support import syntax, wheels
from tests.support.matrix import MatrixHooks
from tests.support.releases import SEED

pytestmark = pytest.mark.wheel

PATCH = Sm120Mxfp4MoeBackend()
FIXED = "0.5.10"
FLAG = "is_mxfp4_quant_format"
# What each upstream release's own capability-12 branch picks (read off the wheels): 0.5.14
# moved capability 12 to Marlin, 0.5.17 to FlashInfer's SM120 CUTLASS MXFP4 kernel.
UPSTREAM_SM120 = {"<0.5.14": "triton_kernel", ">=0.5.14,<0.5.17": "marlin", ">=0.5.17": None}


def _path(release: str) -> str:
    target = TARGET.get(Version(release))
    assert target is not None
    return f"sglang/{target}"


def _gate(test: ast.expr) -> str | None:
    if not (
        isinstance(test, ast.BoolOp)
        and isinstance(test.op, ast.And)
        and len(test.values) == 2
        and isinstance(test.values[1], ast.Name)
        and test.values[1].id == FLAG
    ):
        return None
    left = test.values[0]
    if isinstance(left, ast.Call) and isinstance(left.func, ast.Name):
        return left.func.id
    return left.attr if isinstance(left, ast.Attribute) else None


def _chain(node: ast.If) -> list[ast.If]:
    chain = [node]
    while len(chain[-1].orelse) == 1 and isinstance(chain[-1].orelse[0], ast.If):
        chain.append(chain[-1].orelse[0])
    return chain


@cache
def _selection(source: bytes) -> ast.stmt:
    """The statement that makes the choice: the MXFP4 chain, with its "auto" guard if any."""

    def is_head(node: ast.stmt) -> bool:
        return isinstance(node, ast.If) and any(_gate(b.test) for b in _chain(node))

    tree = syntax.tree(source)
    heads = [n for n in ast.walk(tree) if isinstance(n, ast.stmt) and is_head(n)]
    elifs = {id(n.orelse[0]) for n in heads if isinstance(n, ast.If) and n.orelse}
    (head,) = [n for n in heads if id(n) not in elifs]  # elif nodes are Ifs too
    # From 0.5.5 the chain runs only under `if <args>.moe_runner_backend == "auto":`.
    guards = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.If)
        and head in n.body
        and isinstance(n.test, ast.Compare)
        and isinstance(n.test.left, ast.Attribute)
        and n.test.left.attr == "moe_runner_backend"
    ]
    return guards[0] if guards else head


def choice(
    source: bytes,
    release: str,
    capability: tuple[int, int],
    mxfp4: bool = True,
    requested: str = "auto",
) -> str:
    """Run the release's own MXFP4 MoE-backend choice; return the backend it leaves set."""
    statement = _selection(source)
    args = types.SimpleNamespace(
        moe_runner_backend=requested,
        ep_size=1,
        quantization=None,
        enable_piecewise_cuda_graph=False,
    )
    overrides: dict[str, str] = {}  # 0.5.15+ return overrides instead of setting fields
    stand_ins.run_statement(
        statement,
        stand_ins.host_names(release, capability),
        {"self": args, "cfg": args, "server_args": args, "overrides": overrides, FLAG: mxfp4},
    )
    result = overrides.get("moe_runner_backend", args.moe_runner_backend)
    assert isinstance(result, str)
    return result


def _upstream_sm120(release: Version) -> str | None:
    from packaging.specifiers import SpecifierSet

    (value,) = [v for spec, v in UPSTREAM_SM120.items() if release in SpecifierSet(spec)]
    return value


def matrix_expected(release: Version) -> str:
    if release < Version("0.5.4.post2"):
        return "not for this release"
    return "applied" if release < Version(FIXED) else "already upstream"


def matrix_symptom(release: Version, pristine: Mapping[str, bytes]) -> None:
    """Unpatched, capability 12 gets the SM100-only FlashInfer MXFP4 (trtllm-gen) kernel."""
    source = pristine[_path(str(release))]
    for capability in stand_ins.SM120:
        assert choice(source, str(release), capability) == "flashinfer_mxfp4"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    name = str(release)
    path = _path(name)
    source = patched[path]
    if release >= Version(FIXED):  # upstream's own branch for capability 12
        expected = _upstream_sm120(release)
        for capability in stand_ins.SM120:
            got = choice(source, name, capability)
            assert got == (expected or "flashinfer_mxfp4"), (capability, got)
        assert choice(source, name, (10, 0)) == "flashinfer_mxfp4"
        if expected is None:  # 0.5.17+: the same name, but from the SM120 branch (CUTLASS)
            assert "is_sm120" in source.decode()
        return
    upstream = wheels.member(FIXED, _path(FIXED))
    for capability in stand_ins.SM120:
        assert choice(source, name, capability) == choice(upstream, FIXED, capability)
    pristine = wheels.member(name, path)
    for capability in stand_ins.OTHERS:
        assert choice(source, name, capability) == choice(pristine, name, capability)


RELEASES = ["0.5.4.post2", "0.5.5.post3", SEED]  # the three shapes of the choice


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_capability_12_chooses_what_0_5_10_chooses(
    release: str, capability: tuple[int, int]
) -> None:
    patched = wheels.patched(release, patch=PATCH)
    upstream = wheels.member(FIXED, _path(FIXED))
    assert choice(upstream, FIXED, capability) == "triton_kernel"
    assert choice(patched, release, capability) == choice(upstream, FIXED, capability)


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_unpatched_capability_12_gets_the_sm100_only_kernel(
    release: str, capability: tuple[int, int]
) -> None:
    assert choice(wheels.member(release, _path(release)), release, capability) == (
        "flashinfer_mxfp4"
    )


@pytest.mark.parametrize("release", RELEASES)
@pytest.mark.parametrize("capability", stand_ins.OTHERS, ids=str)
@pytest.mark.parametrize("mxfp4", [True, False], ids=["mxfp4", "bf16"])
def test_other_capabilities_choose_what_they_chose(
    release: str, capability: tuple[int, int], mxfp4: bool
) -> None:
    pristine = wheels.member(release, _path(release))
    patched = wheels.patched(release, patch=PATCH)
    assert choice(patched, release, capability, mxfp4) == choice(
        pristine, release, capability, mxfp4
    )
    if capability == (10, 0) and mxfp4:
        assert choice(patched, release, capability) == "flashinfer_mxfp4"


@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_bf16_gpt_oss_on_capability_12_is_untouched(capability: tuple[int, int]) -> None:
    pristine = wheels.member(SEED, _path(SEED))
    assert choice(wheels.patched(SEED, patch=PATCH), SEED, capability, mxfp4=False) == choice(
        pristine, SEED, capability, mxfp4=False
    )


@pytest.mark.parametrize("requested", ["triton", "flashinfer_mxfp4", "triton_kernel"])
@pytest.mark.parametrize("capability", stand_ins.SM120, ids=str)
def test_a_backend_the_user_chose_is_kept_as_0_5_10_keeps_it(
    requested: str, capability: tuple[int, int]
) -> None:
    upstream = wheels.member(FIXED, _path(FIXED))
    assert (
        choice(wheels.patched(SEED, patch=PATCH), SEED, capability, requested=requested)
        == requested
    )
    assert choice(upstream, FIXED, capability, requested=requested) == requested


MATRIX = MatrixHooks(matrix_expected, matrix_effect, matrix_symptom)
