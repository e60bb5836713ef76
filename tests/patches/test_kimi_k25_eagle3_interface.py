from __future__ import annotations

from collections.abc import Mapping

import pytest
from packaging.version import Version

from sglpatch import engine
from sglpatch.patches.kimi_k25_eagle3_interface import CLASS, METHODS, KimiK25Eagle3Interface
from sglpatch.results import AlreadyApplied, Applied
from tests.support import proofs, wheels
from tests.support.matrix import MatrixHooks

KIMI = "sglang/srt/models/kimi_k25.py"

pytestmark = pytest.mark.wheel


def matrix_expected(release: Version) -> str:
    if release < Version("0.5.9"):
        return "not for this release"  # Kimi K2.5 first ships in 0.5.9
    return "applied" if release == Version("0.5.9") else "already upstream"


def matrix_effect(release: Version, patched: Mapping[str, bytes]) -> None:
    calls = proofs.drive_eagle3_interface(proofs.model_methods(patched[KIMI], CLASS, METHODS))
    assert calls["returned"] == ("embed", "head")
    calls["language_model"].set_embed_and_head.assert_called_once_with("new-embed", "new-head")


def test_0_5_9_lacks_the_interface() -> None:
    with pytest.raises(AttributeError, match="get_embed_and_head"):
        proofs.model_methods(wheels.member("0.5.9", KIMI), CLASS, METHODS)


def test_the_added_methods_delegate_to_the_language_model() -> None:
    change, outcomes = engine.transform_source(
        wheels.member("0.5.9", KIMI), KIMI, [KimiK25Eagle3Interface()], Version("0.5.9")
    )
    assert isinstance(outcomes["kimi-k25-eagle3-interface"], Applied) and change is not None
    result = proofs.drive_eagle3_interface(proofs.model_methods(change.after, CLASS, METHODS))
    language_model = result["language_model"]
    assert result["returned"] == ("embed", "head")
    language_model.set_embed_and_head.assert_called_once_with("new-embed", "new-head")
    assert [c.args for c in language_model.set_eagle3_layers_to_capture.call_args_list] == [
        ([2, 30, 57],),
        (None,),
    ]
    # the rest of the file is byte for byte what it was
    original = wheels.member("0.5.9", KIMI)
    assert change.after.startswith(original.split(b"\n\n\nEntryClass")[0])


def test_0_5_10_has_it_upstream_and_it_behaves_the_same() -> None:
    source = wheels.member("0.5.10", KIMI)
    change, outcomes = engine.transform_source(
        source, KIMI, [KimiK25Eagle3Interface()], Version("0.5.10")
    )
    outcome = outcomes["kimi-k25-eagle3-interface"]
    assert change is None
    assert isinstance(outcome, AlreadyApplied) and outcome.by == "upstream"
    assert str(outcome.fixed_in) == "0.5.10"
    result = proofs.drive_eagle3_interface(proofs.model_methods(source, CLASS, METHODS))
    assert result["returned"] == ("embed", "head")


MATRIX = MatrixHooks(matrix_expected, matrix_effect)
