"""Property-based: formatting variants of the upstream shapes either patch cleanly (the
postcondition holds, the result behaves, revert is byte-exact) or are refused with nothing written."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from packaging.version import Version

from sglpatch import api, catalogue, engine
from sglpatch.patch import Patch
from sglpatch.results import AlreadyApplied, Applied, Failed
from tests.conftest import snapshot
from tests.support import proofs, wheels
from tests.support.releases import SEED

RELEASE = Version(SEED)
PATCHES = {p.id: p for p in catalogue.load()}
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"
COMMUNICATOR = "sglang/srt/distributed/device_communicators/torch_symm_mem.py"
KIMI = "sglang/srt/models/kimi_k25.py"
TABLE = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"

comments = st.sampled_from(["", "  # tuned", "  # 64 MB", "  # TODO: measure"])
noise = st.sampled_from(["", "import os\n", "X = 1  # unrelated\n", '"""Module docstring."""\n'])


def render_dict(draw: st.DrawFn, rows: list[tuple[str, str]], indent: str) -> str:
    """A dict literal laid out one of several ways, with comments and trailing commas or not."""
    inline = draw(st.booleans())
    trailing = draw(st.booleans())
    if inline:
        sep = draw(st.sampled_from([", ", ",  ", ","]))
        body = sep.join(f"{k}: {v}" for k, v in rows) + ("," if trailing and rows else "")
        return "{" + body + "}"
    lines = []
    for index, (key, value) in enumerate(rows):
        last = index == len(rows) - 1
        comma = "," if (not last or trailing) else ""
        lines.append(f"{indent}    {key}: {value}{comma}{draw(comments)}")
    return "{\n" + "\n".join(lines) + f"\n{indent}}}"


@st.composite
def size_modules(draw: st.DrawFn) -> str:
    caps = draw(st.lists(st.sampled_from([8, 9, 11, 13, 90]), unique=True, max_size=3))
    if draw(st.integers(0, 9)) > 0:
        caps.append(10)
    if draw(st.integers(0, 9)) == 0:
        caps.append(12)
    caps = draw(st.permutations(caps))
    rows = []
    for cap in caps:
        sizes = draw(st.lists(st.sampled_from([2, 4, 6, 8]), unique=True, min_size=1, max_size=4))
        inner = [
            (str(ws), draw(st.sampled_from(["64 * MiB", "2**27", "128 * MiB", "1024"])))
            for ws in sizes
        ]
        rows.append((str(cap), render_dict(draw, inner, "    ")))
    head = draw(noise) + "MiB = 1024 * 1024\n" + draw(st.sampled_from(["", "\n", "# sizes\n"]))
    return head + f"{TABLE} = " + render_dict(draw, rows, "") + "\n" + draw(noise)


@st.composite
def communicator_modules(draw: st.DrawFn) -> str:
    caps = draw(st.permutations([c for c in (9, 10, 11) if c == 10 or draw(st.booleans())]))
    rows = [
        (
            str(c),
            "["
            + ", ".join(map(str, draw(st.lists(st.sampled_from([4, 6, 8]), unique=True))))
            + "]",
        )
        for c in caps
    ]
    table = render_dict(draw, rows, "    ")
    lookup = draw(
        st.sampled_from(
            ["self._WORLD_SIZES_MULTIMEM[cap]", "self._WORLD_SIZES_MULTIMEM.get(cap, ())"]
        )
    )
    members = [
        f"    _WORLD_SIZES_MULTIMEM = {table}\n",
        f"    def multimem(self, cap, world_size):\n        return world_size in {lookup}\n",
        "    @staticmethod\n    def helper():\n        return None\n",
        '    """A communicator."""\n',
        "    disabled = True  # class default\n",
    ]
    chosen = [m for i, m in enumerate(members) if i < 2 or draw(st.booleans())]
    body = "\n".join(draw(st.permutations(chosen)))
    return draw(noise) + "class TorchSymmMemCommunicator:\n" + body + draw(noise)


@st.composite
def kimi_modules(draw: st.DrawFn) -> str:
    assign = draw(st.sampled_from([
        "self.language_model = build(config)",
        "self.language_model: nn.Module = build(config)",
        "self.vision_tower, self.language_model = build(config)",
        "self.text_model = build(config)",  # no delegate: must be refused
    ]))  # fmt: skip
    methods = [
        f"    def __init__(self, config):\n        super().__init__()\n        {assign}\n",
        "    @property\n    def dtype(self):\n        return self.language_model.dtype\n",
        "    @torch.no_grad()\n    def forward(self, x):  # the hot path\n        return self.language_model(x)\n",
        "    def get_embed_and_head(self):\n        return self.language_model.get_embed_and_head()\n",
        "    # a comment between methods\n    def pad_input_ids(self, ids, mm):\n        return ids\n",
    ]
    chosen = [m for i, m in enumerate(methods) if i == 0 or draw(st.booleans())]
    body = "\n".join(draw(st.permutations(chosen)))
    decorator = draw(st.sampled_from(["", "@register\n"]))
    return (
        draw(noise)
        + f"{decorator}class KimiK25ForConditionalGeneration(nn.Module):\n"
        + body
        + draw(noise)
    )


def check_outcome(patch: Patch, source: str) -> tuple[str, bytes | None]:
    change, outcomes = engine.transform_source(source.encode(), "f.py", [patch], RELEASE)
    outcome = outcomes[patch.id]
    if isinstance(outcome, Applied):
        assert change is not None
        again, second = engine.transform_source(change.after, "f.py", [patch], RELEASE, [patch.id])
        assert again is None and isinstance(second[patch.id], AlreadyApplied)
        return "applied", change.after
    assert change is None
    assert isinstance(outcome, (Failed, AlreadyApplied))
    return outcome.state, None


@settings(max_examples=100, deadline=None)
@given(size_modules())
def test_size_tables(source: str) -> None:
    state, after = check_outcome(PATCHES["sm120-symm-mem-sizes"], source)
    before = proofs.size_table(source.encode(), TABLE)
    expected = "already upstream" if 12 in before else "failed" if 10 not in before else "applied"
    assert state == expected
    if after is None:
        return
    table = proofs.size_table(after, TABLE)
    assert table[12] == table[10] and {k: v for k, v in table.items() if k != 12} == before


@settings(max_examples=100, deadline=None)
@given(communicator_modules())
def test_communicator_tables(source: str) -> None:
    state, after = check_outcome(PATCHES["sm120-symm-mem-two-shot"], source)
    if ".get(cap, ())" in source:
        assert state == "already upstream"
        return
    assert after is not None
    namespace: dict[str, object] = {}
    exec(compile(after, "c.py", "exec"), namespace)
    cls = namespace["TorchSymmMemCommunicator"]
    assert cls._WORLD_SIZES_MULTIMEM[12] == []  # type: ignore[attr-defined]
    assert not cls().multimem(12, 8)  # type: ignore[operator]


@settings(max_examples=100, deadline=None)
@given(kimi_modules())
def test_kimi_classes(source: str) -> None:
    state, after = check_outcome(PATCHES["kimi-k25-eagle3-interface"], source)
    if "self.text_model" in source:
        assert state == "failed"
        return
    assert after is not None and state == "applied"
    result = proofs.drive_eagle3_interface(
        proofs.model_methods(
            after,
            "KimiK25ForConditionalGeneration",
            ["get_embed_and_head", "set_embed_and_head", "set_eagle3_layers_to_capture"],
        )
    )
    assert result["returned"] == ("embed", "head")
    assert after.count(b"def get_embed_and_head") == 1


@pytest.fixture(scope="module")
def base_tree(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return wheels.site_packages(
        SEED, tmp_path_factory.mktemp("base") / "site", wheels.patch_targets(SEED)
    )


@pytest.mark.wheel
@settings(
    max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(st.one_of(
    size_modules().map(lambda s: (SIZES, s)),
    communicator_modules().map(lambda s: (COMMUNICATOR, s)),
    kimi_modules().map(lambda s: (KIMI, s)),
))  # fmt: skip
def test_apply_and_revert_end_to_end(base_tree: Path, variant: tuple[str, str]) -> None:
    member, source = variant
    with tempfile.TemporaryDirectory() as scratch:
        site = Path(scratch) / "site"
        shutil.copytree(base_tree, site)
        (site / member).write_text(source)
        pristine = snapshot(site)
        report = api.apply(site, None, Path(scratch) / "ledger")
        if report.failures:
            assert not report.written and snapshot(site) == pristine  # refused: nothing written
            assert not (Path(scratch) / "ledger" / "targets").exists()
            return
        assert report.written
        api.revert(site, Path(scratch) / "ledger")
        assert snapshot(site) == pristine
