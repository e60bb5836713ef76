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
from sglpatch import catalogue
from sglpatch.patch import ByRelease, Patch


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
        ByRelease({">=0.5": 1, ">=0.5.9": 2}).get(Version("0.5.9"))


class _Dummy(Patch):
    description = "a test patch"
    tested = SpecifierSet(">=0.5")

    def target_file(self, release: Version) -> str | None:
        return None

    def transform(self, module, release):  # type: ignore[no-untyped-def]
        return module

    def postcondition(self, module, release):  # type: ignore[no-untyped-def]
        return None


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
    from sglpatch.cli import ID_WIDTH

    assert max(len(p.id) for p in catalogue.load()) <= ID_WIDTH
