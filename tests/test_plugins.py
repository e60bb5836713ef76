"""Third-party patches: from --catalog DIR and from an installed package's entry points.

The plugin used here is the example of docs/writing-patches.md, read from that page.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from sglpatch import api
from sglpatch.cli import app
from sglpatch.errors import ExitCode
from tests.support import proofs

PAGE = Path(__file__).resolve().parent.parent / "docs" / "writing-patches.md"
SIZES = "sglang/srt/distributed/device_communicators/all_reduce_utils.py"


def docs_example() -> str:
    text = PAGE.read_text(encoding="utf-8")
    match = re.search(r"<!-- example: plugin -->\n```python\n(.*?)```", text, re.DOTALL)
    assert match, "docs/writing-patches.md lost its plugin example"
    return match.group(1)


@pytest.fixture
def catalog(tmp_path: Path) -> Path:
    folder = tmp_path / "my-patches"
    folder.mkdir()
    (folder / "sm110_symm_mem_sizes.py").write_text(docs_example())
    return folder


@pytest.mark.wheel
def test_the_docs_example_from_a_catalog_folder(
    runner: CliRunner, site_059: Path, catalog: Path
) -> None:
    listing = runner.invoke(app, ["list", "--catalog", str(catalog)]).stdout
    assert (
        f"sm110-symm-mem-sizes  [{catalog}]" in listing
        and "sm120-symm-mem-sizes  [built-in]" in listing
    )

    result = runner.invoke(app, ["apply", "--target", str(site_059), "--catalog", str(catalog)])
    assert result.exit_code == 0, result.stderr
    table = proofs.size_table(
        (site_059 / SIZES).read_bytes(), "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
    )
    assert table[11] == table[12] == table[10]  # both patches, on one file, in one apply

    status = {r.id: r.state for r in api.status(site_059, catalog=catalog).patches}
    assert status["sm110-symm-mem-sizes"] == "applied"
    assert runner.invoke(app, ["revert", "--target", str(site_059)]).exit_code == 0
    assert 11 not in proofs.size_table(
        (site_059 / SIZES).read_bytes(), "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"
    )


def test_an_installed_plugin_is_found_by_its_entry_point(tmp_path: Path) -> None:
    site = tmp_path / "plugins"
    package = site / "thor_patches"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text("")
    (package / "sm110_symm_mem_sizes.py").write_text(docs_example())
    info = site / "thor_patches-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: thor-patches\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[sglpatch.patches]\nsm110-symm-mem-sizes = thor_patches.sm110_symm_mem_sizes\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "sglpatch", "list", "--json"],
        capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(site)},
    )  # fmt: skip
    origins = {p["id"]: p["origin"] for p in __import__("json").loads(result.stdout)["patches"]}
    assert origins["sm110-symm-mem-sizes"] == "plugin thor-patches"
    assert origins["kimi-k25-eagle3-interface"] == "built-in"


def test_a_broken_plugin_is_a_one_line_usage_error(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text("import does_not_exist\n")
    result = runner.invoke(app, ["list", "--catalog", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE
    assert "bad.py" in result.stderr and "does_not_exist" in result.stderr
    (tmp_path / "bad.py").write_text("X = 1\n")
    result = runner.invoke(app, ["list", "--catalog", str(tmp_path)])
    assert result.exit_code == ExitCode.USAGE and "defines 0 patches" in result.stderr


def test_a_plugin_cannot_take_a_built_in_id(
    runner: CliRunner, tmp_path: Path, catalog: Path
) -> None:
    source = (catalog / "sm110_symm_mem_sizes.py").read_text()
    (catalog / "sm110_symm_mem_sizes.py").write_text(
        source.replace('id = "sm110-symm-mem-sizes"', 'id = "sm120-symm-mem-sizes"')
    )
    result = runner.invoke(app, ["list", "--catalog", str(catalog)])
    assert (
        result.exit_code == ExitCode.USAGE
        and "two patches use the id 'sm120-symm-mem-sizes'" in result.stderr
    )


RAISING = '''"""A test plugin whose codemod has a bug."""

from __future__ import annotations

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.patch import Patch


class Buggy(Patch):
    """Raises inside its own code."""

    id = "buggy"
    description = "has a bug"
    symptom = "none"
    tested = SpecifierSet(">=0.5.3")

    def target_file(self, release: Version) -> str | None:
        return "srt/models/kimi_k25.py"

    def transform(self, module, release):  # type: ignore[no-untyped-def]
        return {}["no such key"]

    def postcondition(self, module, release):  # type: ignore[no-untyped-def]
        pass
'''


@pytest.mark.wheel
def test_a_plugin_that_raises_is_named_not_an_internal_error(
    runner: CliRunner, site_059: Path, tmp_path: Path
) -> None:
    catalog = tmp_path / "buggy"
    catalog.mkdir()
    (catalog / "buggy.py").write_text(RAISING)
    ledger = tmp_path / "ledger"
    before = (site_059 / "sglang/srt/models/kimi_k25.py").read_bytes()
    result = runner.invoke(
        app, ["apply", "-t", str(site_059), "--catalog", str(catalog), "--ledger", str(ledger)]
    )
    assert result.exit_code == ExitCode.TARGET, result.stdout
    err = result.stderr
    assert f"patch buggy from {catalog} raised KeyError" in err and "internal error" not in err
    assert "nothing was written" in err
    log = ledger / "sglpatch-crash.log"
    assert f"details in {log}" in err and 'return {}["no such key"]' in log.read_text()
    assert (site_059 / "sglang/srt/models/kimi_k25.py").read_bytes() == before


def test_why_a_plugin_failed_to_load_is_kept(runner: CliRunner, tmp_path: Path) -> None:
    (tmp_path / "bad.py").write_text(
        "def helper():\n    raise ValueError('deep cause')\nhelper()\n"
    )
    result = runner.invoke(app, ["list", "--catalog", str(tmp_path), "--json"])
    assert result.exit_code == ExitCode.USAGE
    log = Path(result.stderr.split("details in ")[1].rstrip(")\n"))
    assert "in helper" in log.read_text()  # the traceback, not only the last line
