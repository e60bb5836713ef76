from __future__ import annotations

import importlib
import pkgutil
import sys
import types
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import Version

import sglpatch.patches
from sglpatch import catalogue, engine
from sglpatch.patch import (
    NEWEST_TESTED,
    OLDEST_TESTED,
    ByRelease,
    Concerns,
    Effect,
    Patch,
    since,
)
from sglpatch.results import Applied
from tests.support import wheels
from tests.support.releases import RELEASES, SEED


def test_every_module_holds_exactly_one_well_formed_patch() -> None:
    names = [m.name for m in pkgutil.iter_modules(sglpatch.patches.__path__)]
    assert len(names) >= 3
    patches = catalogue.load()
    assert len(patches) == len(names)
    for name in names:
        module = importlib.import_module(f"sglpatch.patches.{name}")
        cls = catalogue.patch_in(module)
        assert "Delete when" in (module.__doc__ or ""), f"{name} must say when it can go"
        assert isinstance(cls.tested, SpecifierSet)
        assert cls.id.replace("-", "_") == name, "the module is named for what the patch does"


def test_ids_are_unique_and_sorted() -> None:
    ids = [p.id for p in catalogue.load()]
    assert ids == sorted(set(ids))


def test_a_module_with_two_patches_is_rejected() -> None:
    module = types.ModuleType("two")
    for cls_name in ("A", "B"):
        cls = type(cls_name, (_Dummy,), {"__module__": "two", "id": cls_name.lower()})
        setattr(module, cls_name, cls)
    with pytest.raises(catalogue.CatalogueError, match="defines 2 patches"):
        catalogue.patch_in(module)


def test_a_malformed_declaration_is_rejected(monkeypatch: pytest.MonkeyPatch) -> None:
    module = types.ModuleType("bad")
    module.__doc__ = "Why."
    monkeypatch.setitem(sys.modules, "bad", module)
    cls = type("Bad", (_Dummy,), {"__module__": "bad", "id": "Not An Id", "__doc__": "x"})
    module.Bad = cls  # type: ignore[attr-defined]
    with pytest.raises(catalogue.CatalogueError, match="id must be"):
        catalogue.load(modules=[(module, "test")])


def test_by_release_picks_exactly_one_row() -> None:
    table = ByRelease({"<0.5.4.post3": "old", ">=0.5.4.post3": "new"})
    assert table.get(Version("0.5.4.post2")) == "old"
    assert table.get(Version("0.5.4.post3")) == "new"
    assert table.get(Version("0.6.0rc1")) == "new"
    assert ByRelease({">=0.5.9": 1}).get(Version("0.5.8")) is None
    with pytest.raises(ValueError, match="2 rows"):
        ByRelease({">=0.5": 1, ">=0.5.9": 2}).get(Version(SEED))


class _Codemod(Patch):
    """A codemod that names no file: each subclass says which."""

    description = "a test patch"
    tested = SpecifierSet(">=0.5")

    def transform(self, module, release):  # type: ignore[no-untyped-def]
        return module

    def postcondition(self, module, release):  # type: ignore[no-untyped-def]
        return None


class _Dummy(_Codemod):
    def target_file(self, release: Version) -> str | None:
        return None


def test_target_file_reads_the_files_table() -> None:
    table = ByRelease({"<0.5.4": "old.py", ">=0.5.4,<0.5.9": "new.py", ">=0.5.9": None})
    cls = type("Declared", (_Codemod,), {"id": "declared", "files": table})
    patch = cls()
    assert patch.target_file(Version("0.5.3")) == "old.py"
    assert patch.package_file(Version("0.5.4.post1")) == "new.py"
    assert patch.target_file(Version(SEED)) is None


def test_a_patch_that_names_no_file_is_not_a_patch() -> None:
    """Neither `files` nor its own `target_file`: abstract, as when target_file was abstract."""
    module = types.ModuleType("nameless")
    module.Nameless = type("Nameless", (_Codemod,), {"__module__": "nameless", "id": "x"})  # type: ignore[attr-defined]
    with pytest.raises(catalogue.CatalogueError, match="defines 0 patches"):
        catalogue.patch_in(module)


# A plugin written as the built-in patches are: one import, a files table, a tested range.
DECLARATIVE = '''"""Give capability 11 a size row. Delete when: never, it is a test."""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import AlreadyPresent, ByRelease, Patch, PostconditionFailed, cst, cst_tools, since

TABLE = "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES"


class Sm110Sizes(Patch):
    """Copy capability 10's row to 11."""

    id = "sm110-sizes"
    description = "sizes for capability 11"
    symptom = "KeyError: 11"
    tested = since("0.5.9")
    files = ByRelease({"<0.5.4.post3": None, ">=0.5.4.post3": "srt/sizes.py"})

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        table = cst_tools.find_dict(module.body, TABLE)
        if cst_tools.dict_row(table, 11) is not None:
            raise AlreadyPresent("the table has a row for 11")
        row = cst_tools.dict_row(table, 10).deep_clone().with_changes(key=cst.Integer("11"))
        return cst_tools.replace(module, table, cst_tools.with_row_after(table, 10, row))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        if cst_tools.dict_row(cst_tools.find_dict(module.body, TABLE), 11) is None:
            raise PostconditionFailed("no row for 11")
'''


def test_a_declarative_plugin_needs_one_import_and_a_files_table(tmp_path: Path) -> None:
    (tmp_path / "sm110_sizes.py").write_text(DECLARATIVE)
    [patch] = catalogue.load(modules=catalogue.directory_modules(tmp_path))
    assert str(patch.tested) == f"<={NEWEST_TESTED},>=0.5.9"
    assert patch.package_file(Version("0.5.4.post2")) is None
    release = Version(SEED)
    assert patch.package_file(release) == "srt/sizes.py"
    source = b"TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES = {\n    9: {2: 1},\n    10: {2: 2}\n}\n"
    change, outcomes = engine.transform_source(source, "sizes.py", [patch], release)
    assert isinstance(outcomes[patch.id], Applied) and change is not None
    assert change.after == source.replace(b"}\n}", b"},\n    11: {2: 2}\n}")  # laid out as 9 and 10


def test_the_newest_tested_release_is_written_once() -> None:
    """A new SGLang release is one edit to the catalogue: `NEWEST_TESTED` in sglpatch.patch."""
    assert (wheels.RELEASES[0], wheels.RELEASES[-1]) == (OLDEST_TESTED, NEWEST_TESTED)
    folder = Path(sglpatch.patches.__path__[0])
    for path in sorted(folder.glob("*.py")):
        assert f"<={NEWEST_TESTED}" not in path.read_text(encoding="utf-8"), path.name
    for patch in catalogue.load():
        assert patch.tested == since(OLDEST_TESTED), patch.id  # until one needs its own


# Every public name of sglpatch.cst_tools while it was one module (cst_tools.py, 2026-12-01).
CST_TOOLS_NAMES = {
    "AnchorMissing", "Iterator", "Sequence", "Step", "T", "TypeGuard", "TypeVar", "annotations",
    "append_to_class", "assigns_self_attribute", "class_body", "cst", "dataclasses", "dict_row",
    "find_class", "find_compound", "find_dict", "find_function", "function_body", "if_chain",
    "if_chains",
    "ifs_testing", "imported_names", "int_key", "method_calls_on", "method_names", "methods",
    "replace", "replace_statement", "statement", "walk", "with_alias", "with_branch_before",
    "with_imported_name", "with_row_after", "with_statements_beside",
}  # fmt: skip
# Of those, what the module's own imports leaked: the typing helpers, not its API.
LEAKED = {"Iterator", "Sequence", "TypeGuard", "TypeVar", "dataclasses"}


def test_cst_tools_keeps_its_public_names() -> None:
    import libcst

    from sglpatch import cst_tools

    public = {name for name in dir(cst_tools) if not name.startswith("_")}
    assert public - {"edit", "find", "walking"} == CST_TOOLS_NAMES - LEAKED
    assert set(cst_tools.__all__) == CST_TOOLS_NAMES - LEAKED - {"annotations"}
    assert callable(cst_tools.walk) and cst_tools.cst is libcst  # not shadowed by a submodule


def test_production_code_checks_with_errors_not_assert() -> None:
    """`assert` vanishes under `python -O`: no check in sglpatch or its patches may use one."""
    import ast

    package = Path(catalogue.__file__).parent
    found = [
        f"{path.relative_to(package)}:{node.lineno}"
        for path in sorted(package.rglob("*.py"))
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assert)
    ]
    assert found == []


def test_the_cli_id_column_fits_every_built_in_id() -> None:
    from sglpatch.cli.output import id_width

    assert max(len(p.id) for p in catalogue.load()) == id_width()


def _declaring(monkeypatch: pytest.MonkeyPatch, **attrs: object) -> list[Patch]:
    """Load one patch with these class attributes (and an id, a symptom, docstrings)."""
    module = types.ModuleType("declares")
    module.__doc__ = "Why."
    monkeypatch.setitem(sys.modules, "declares", module)
    body = {"__module__": "declares", "__doc__": "x", "id": "declares", "symptom": "it breaks"}
    module.Declares = type("Declares", (_Dummy,), {**body, **attrs})  # type: ignore[attr-defined]
    return catalogue.load(modules=[(module, "test")])


def test_a_patch_that_declares_nothing_concerns_every_model_and_changes_the_run(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A plugin written before `concerns` and `effect` existed keeps working: the safe defaults."""
    [patch] = _declaring(monkeypatch)
    assert patch.concerns == Concerns() and patch.concerns.every_model
    assert patch.effect_on(Version(SEED)) is Effect.RUN


def test_an_effect_table_is_read_per_release(monkeypatch: pytest.MonkeyPatch) -> None:
    table = ByRelease({"<0.5.14": Effect.RUN, ">=0.5.14": Effect.TABLE})
    [patch] = _declaring(monkeypatch, effect=table)
    assert patch.effect_on(Version("0.5.13.post1")) is Effect.RUN
    assert patch.effect_on(Version("0.5.14")) is Effect.TABLE


@pytest.mark.parametrize(
    ("attrs", "problem"),
    [
        ({"concerns": ("KimiK25ForConditionalGeneration",)}, "concerns must be a Concerns"),
        ({"concerns": Concerns(architectures=["Kimi"])}, "architectures must be a tuple"),  # type: ignore[arg-type]
        ({"concerns": Concerns(architectures=("moonshotai/Kimi-K2.5",))}, "class names"),
        ({"concerns": Concerns(architectures=("A", "A"))}, "distinct class names"),
        ({"concerns": Concerns(uses=("srt.layers.attention.vision",))}, "sglang.* module"),
        ({"concerns": Concerns(quantization=("NVFP4 ",))}, "--quantization names"),
        ({"concerns": Concerns(flag="enable-torch-symm-mem")}, "concerns.flag"),
        ({"concerns": Concerns(flag="--a\n--b")}, "concerns.flag"),
        ({"concerns": Concerns(unless="kv-cache-dtype fp8_e4m3")}, "concerns.unless"),
        ({"concerns": Concerns(backends=("dsa", "tilelang"))}, "concerns.backends"),  # type: ignore[arg-type]
        ({"concerns": Concerns(backends=(("dsa", ""),))}, "concerns.backends"),
        ({"concerns": Concerns(vision_head_above="128")}, "vision_head_above"),  # type: ignore[arg-type]
        ({"concerns": Concerns(head_sizes=(256, "576"))}, "head_sizes"),  # type: ignore[arg-type]
        ({"concerns": Concerns(runtime="diffusion")}, "runtime must be one of"),
        ({"concerns": Concerns(architectures=("A",), runtime="multimodal_gen")}, "no srt models"),
        ({"effect": "completes a table"}, "effect must be an Effect"),
        ({"effect": ByRelease({">=0.5.9": Effect.TABLE})}, "no row for SGLang 0.5"),
        ({"effect": ByRelease({">=0.4": Effect.RUN, "<=0.5": Effect.TABLE})}, "2 rows match"),
    ],
)
def test_a_malformed_concerns_or_effect_is_rejected(
    monkeypatch: pytest.MonkeyPatch, attrs: dict[str, object], problem: str
) -> None:
    with pytest.raises(catalogue.CatalogueError, match=problem):
        _declaring(monkeypatch, **attrs)


def test_every_built_in_patch_declares_an_effect_for_each_release() -> None:
    """`effect_on` answers from the patch's own table on every release (no silent fallback)."""
    for patch in catalogue.load():
        effect = type(patch).effect
        for release in map(Version, RELEASES):
            row = effect.get(release) if isinstance(effect, ByRelease) else effect
            assert isinstance(row, Effect), (patch.id, release)
