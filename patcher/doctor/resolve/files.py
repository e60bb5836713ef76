"""The files of one SGLang release the resolution reads: its Python modules by their path below
the package's parent (`sglang/srt/server_args.py`), and the import names an install of it has.

A `ReleaseFiles` is either a tree on disk (`TreeFiles`: an installed SGLang or a checkout, what
doctor reads) or anything else that can hand out the same bytes (the tests read the wheels with
their own). Reads are cached for the life of the object: an evaluation reads the same modules for
every model.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from pathlib import Path

from sglpatch.doctor.read.source_tree import read_file

# Installed with every release whatever its metadata says (SGLang's CUDA kernels and torch).
ALWAYS_INSTALLED = frozenset({"torch", "triton", "transformers", "sgl_kernel", "flashinfer"})
# Import names of requirements whose distribution is named otherwise.
_IMPORT_NAMES = {"flashinfer_python": "flashinfer", "sglang_kernel": "sgl_kernel",
                 "nvidia_cutlass_dsl": "cutlass", "pillow": "PIL", "pyyaml": "yaml"}  # fmt: skip
_REQUIRES = re.compile(r"^Requires-Dist:\s*([A-Za-z0-9_.\-]+)(.*)$", re.M)
_DEPENDENCIES = re.compile(r"^dependencies\s*=\s*\[(.*?)^\]", re.M | re.S)


class ReleaseFiles:
    """One release's files: `exists`, `read` (bytes, KeyError when absent), `below` (the
    Python files under a folder) and `installed`."""

    def __init__(
        self,
        read: Callable[[str], bytes],
        exists: Callable[[str], bool],
        below: Callable[[str], list[str]],
        requirements: Callable[[], str],
    ) -> None:
        self._read = functools.cache(read)
        self._exists = functools.cache(exists)
        self._below = functools.cache(below)
        self._requirements = requirements

    def read(self, path: str) -> bytes:
        return self._read(path)

    def exists(self, path: str) -> bool:
        return self._exists(path)

    def below(self, folder: str) -> list[str]:
        """The `.py` files under `folder` ("sglang/srt/models/"), sorted."""
        return self._below(folder)

    def tree(self, path: str) -> ast.Module:
        """The module at `path`, parsed once (readers never change a node)."""
        return parsed(self.read(path))

    @functools.cached_property
    def installed(self) -> frozenset[str]:
        """The top-level modules an install of the release has: its unconditional requirements
        (as import names) and torch, triton, transformers, sgl_kernel and flashinfer."""
        return ALWAYS_INSTALLED | import_names(self._requirements())


@functools.lru_cache(maxsize=256)  # by content: every re-run of a release shares the trees
def parsed(source: bytes) -> ast.Module:
    return ast.parse(source)


def import_names(requirements: str) -> frozenset[str]:
    """The import names of a METADATA's unconditional `Requires-Dist` lines, or of a
    pyproject's `dependencies` list (one quoted requirement per item)."""
    found: set[str] = set()
    listed = _DEPENDENCIES.search(requirements)
    if listed:
        pairs = [
            (m.group(1), m.group(2))
            for m in re.finditer(r"[\"']([A-Za-z0-9_.\-]+)([^\"']*)[\"']", listed.group(1))
        ]
    else:
        pairs = [(m.group(1), m.group(2)) for m in _REQUIRES.finditer(requirements)]
    for name, rest in pairs:
        if "extra ==" in rest:
            continue
        normal = re.sub(r"[-.]", "_", name).lower()
        found.add(_IMPORT_NAMES.get(normal, normal))
    return frozenset(found)


def tree_files(package_dir: Path) -> ReleaseFiles:
    """The release whose `sglang` package is `package_dir` (site-packages/sglang or a
    checkout's python/sglang); requirements from the dist-info beside it or the checkout's
    pyproject.toml."""
    parent = package_dir.parent

    def read(path: str) -> bytes:
        data, why = read_file(parent / path)  # bounded: no FIFO or huge file is read
        if data is None:
            raise KeyError(f"{path}: {why or 'missing'}")
        return data

    def exists(path: str) -> bool:
        return (parent / path).is_file()

    def below(folder: str) -> list[str]:
        try:
            found = [p for p in (parent / folder).rglob("*.py") if p.is_file()]
        except OSError:  # a folder that cannot be listed: its hooks are not read
            return []
        return sorted(p.relative_to(parent).as_posix() for p in found)

    def requirements() -> str:
        for info in sorted(parent.glob("sglang-*.dist-info")):
            data, _ = read_file(info / "METADATA")
            if data is not None:
                return data.decode(errors="replace").split("\n\n", 1)[0]
        data, _ = read_file(parent / "pyproject.toml")
        return data.decode(errors="replace") if data is not None else ""

    return ReleaseFiles(read, exists, below, requirements)
