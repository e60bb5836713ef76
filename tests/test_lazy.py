"""A module loaded on first use: a Ctrl-C in its import is raised, and leaves nothing half-run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from sglpatch.lazy import lazy_import

HALFWAY = """
import os

BEFORE = 1
if not os.environ.get("HALFWAY_GOES_ON"):
    raise KeyboardInterrupt  # as a Ctrl-C that lands while the module runs
AFTER = 2
"""


@pytest.mark.parametrize("first_use", ["an import statement", "a name"])
def test_an_interrupted_first_use_is_raised_and_the_next_one_imports_it_whole(
    first_use: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An `import` of the module (a plugin's `import libcst`) dropped the Ctrl-C, and either
    way the half-run module stayed in sys.modules: its later names were missing."""
    (tmp_path / "halfway.py").write_text(HALFWAY)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("HALFWAY_GOES_ON", raising=False)
    try:
        module = lazy_import("halfway")
        with pytest.raises(KeyboardInterrupt):
            if first_use == "a name":
                _ = module.BEFORE
            else:
                __import__("halfway")  # what an `import halfway` statement calls
        monkeypatch.setenv("HALFWAY_GOES_ON", "1")
        assert (module.BEFORE, module.AFTER) == (1, 2)
        assert sys.modules["halfway"].AFTER == 2
    finally:
        sys.modules.pop("halfway", None)
