from __future__ import annotations

import gc
import os
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from tests.support import parsing, syntax, wheels
from tests.support.releases import SEED

# The user's own home, before the session moves HOME away from it (see `_isolate_the_session`).
REAL_HOME = Path.home()


def _isolate_the_session() -> Path:
    """Module- and session-scoped fixtures run before the autouse `isolated`: move HOME, the
    XDG state and config folders and git's config away from the user's for the whole run, so
    nothing a test does reaches `~/.local/state/sglpatch` (pip keeps the user's cache); and
    no real GPU answers doctor."""
    import tempfile

    home = Path(tempfile.mkdtemp(prefix="sglpatch-tests-home-"))
    os.environ.setdefault("PIP_CACHE_DIR", str(REAL_HOME / ".cache" / "pip"))
    os.environ.update(
        HOME=str(home),
        XDG_STATE_HOME=str(home / "state"),
        XDG_CONFIG_HOME=str(home / "config"),
        GIT_CONFIG_GLOBAL=os.devnull,
        GIT_CONFIG_NOSYSTEM="1",
    )
    os.environ.pop("SGLPATCH_LEDGER", None)
    # doctor's compile cache: the session's own (a test of the cache sets another).
    os.environ["SGLPATCH_CACHE_DIR"] = str(home / "cache")
    # doctor asks nvidia-smi which GPUs are present (without --capability): here no GPU answers,
    # on any machine, as on one without nvidia-smi. Tests of the question put theirs first.
    stand_ins = home / "bin"
    stand_ins.mkdir()
    (stand_ins / "nvidia-smi").write_text("#!/bin/sh\nexit 9\n")
    (stand_ins / "nvidia-smi").chmod(0o755)
    os.environ["PATH"] = f"{stand_ins}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return home


def pytest_configure(config: pytest.Config) -> None:
    """Isolate the whole session from the user's home; let the first wheel download show its
    progress on the terminal, past pytest's capture.

    Run with pytest-xdist (`-n`), the controller downloads every release before the workers
    start, where the user sees it; the workers then find them all in the cache.
    """
    home = _isolate_the_session()
    config.add_cleanup(lambda: shutil.rmtree(home, ignore_errors=True))
    capture = config.pluginmanager.getplugin("capturemanager")
    if capture is not None:
        wheels.terminal = capture.global_and_fixture_disabled
    workers = (
        config.getoption("numprocesses", None) if config.pluginmanager.hasplugin("xdist") else None
    )
    if workers and not hasattr(config, "workerinput") and "not wheel" not in config.option.markexpr:
        wheels.fetch(wheels.RELEASES)


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """With `-m "not wheel"`, a module marked `wheel` as a whole is not even imported: its
    module-level constants read the wheels, which would download them (no network)."""
    if "not wheel" not in config.option.markexpr or collection_path.suffix != ".py":
        return None
    try:
        text = collection_path.read_text(encoding="utf-8")
    except OSError:
        return None
    return True if "\npytestmark = pytest.mark.wheel\n" in text else None


@pytest.fixture(autouse=True, scope="session")
def _shared_parses() -> Iterator[None]:
    """A source parsed once in this process serves every later parse of the same bytes
    (`tests/support/parsing.py`: why that proves the same; `parsing.afresh()` opts out), and
    the stand-ins' `ast` trees are shared too (`tests/support/syntax.py`): at the end, every
    one held must read as it was parsed."""
    with parsing.shared():
        yield
    syntax.tree.unchanged()
    # What the tests froze (below) is collected as usual at the end: nanobind (Triton) reports
    # its objects still alive at exit as leaks.
    gc.unfreeze()
    gc.collect()


@pytest.fixture(autouse=True)
def _shared_out_of_the_collectors_way() -> Iterator[None]:
    """After each test, collect what it left and freeze what lives on (`gc.freeze`): Python's
    cyclic collector then no longer walks the shared parses and trees.

    They are millions of objects, and every full collection walked them all: 108 of the 400 CPU
    seconds of the patch tests, the matrix and test_reads (measured 2026-12-02; on 2 cores they
    took 158 s with this instead of 201 s). A frozen tree dropped from a cache is still freed:
    trees hold no reference cycles, so their reference counts free them.
    """
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def isolated(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No test touches the real home, the user's git config, or an installed sglang.

    HOME and XDG_STATE_HOME point into a temporary folder (so the default ledger lands there),
    git reads no global or system config, `python3` on PATH is a stub that finds no sglang, and
    no virtual or conda environment is active (discovery would ask its interpreter first).
    """
    home = tmp_path_factory.mktemp("home")
    bin_dir = tmp_path_factory.mktemp("bin")
    stub = bin_dir / "python3"
    stub.write_text("#!/bin/sh\necho\n")
    stub.chmod(stub.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("XDG_STATE_HOME", str(home / "state"))
    monkeypatch.delenv("SGLPATCH_LEDGER", raising=False)
    monkeypatch.delenv("VIRTUAL_ENV", raising=False)
    monkeypatch.delenv("CONDA_PREFIX", raising=False)
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", os.devnull)
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("NO_COLOR", "1")
    return home


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def ledger_dir(isolated: Path) -> Path:
    return isolated / "state" / "sglpatch"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under `root` with its bytes (pycache excluded)."""
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and "__pycache__" not in p.parts
    }


@pytest.fixture
def site_059(tmp_path: Path) -> Iterator[Path]:
    """A site-packages holding the real SGLang 0.5.9's patch targets."""
    yield wheels.site_packages(SEED, tmp_path / "site-packages", wheels.patch_targets(SEED))
