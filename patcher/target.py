"""Finding the SGLang to patch and knowing its release, without importing it (it pulls in torch)."""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch.errors import RefusedError, TargetError, UsageError


class Layout(str, Enum):
    SITE_PACKAGES = "site-packages"  # an installed wheel: <root>/sglang/
    CHECKOUT = "checkout"  # a git checkout of the sglang repository: <root>/python/sglang/


@dataclass(frozen=True)
class Target:
    """An SGLang tree on disk. File paths in patches are relative to `package_dir`."""

    root: Path
    layout: Layout
    release: Version | None
    release_source: str | None

    @property
    def package_dir(self) -> Path:
        if self.layout is Layout.CHECKOUT:
            return self.root / "python" / "sglang"
        return self.root / "sglang"

    def relative(self, package_path: str) -> str:
        """A path inside the package as seen from the target root (diffs and the ledger use it)."""
        prefix = "python/sglang" if self.layout is Layout.CHECKOUT else "sglang"
        return f"{prefix}/{package_path}"

    def path(self, package_path: str) -> Path:
        return self.package_dir / package_path


def symlink_on_the_way(target: Target, package_path: str) -> str | None:
    """The first folder between the package and `package_path` that is a symbolic link, if any.

    Writing through one would change files outside the tree (or elsewhere in it).
    """
    folder = target.package_dir
    for part in package_path.split("/")[:-1]:
        folder = folder / part
        if folder.is_symlink():
            return target.relative(str(folder.relative_to(target.package_dir)))
    return None


def parse_release(text: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"--version {text!r} is not a release number (e.g. 0.5.9)") from None


def find_target(path: Path | None, requested: Version | None, *, required: bool = True) -> Target:
    """Resolve `--target` (or the active interpreter's sglang) and settle the release.

    `requested` is `--version`: if the target's own release differs, refuse and name both.
    With `required`, a release that is neither found nor given is a usage error.
    """
    root, layout = _locate(path)
    found, source = detect_release(root, layout)
    if requested is not None and found is not None and requested != found:
        raise RefusedError(
            f"--version {requested} does not match the target's release {found} "
            f"(from {source}); drop --version or point --target elsewhere"
        )
    if requested is None and found is None and required:
        raise UsageError(f"cannot tell which SGLang release {root} is; pass --version")
    release = requested if found is None else found
    source = source if found is not None else ("--version" if requested else None)
    return Target(root, layout, release, source)


def _locate(path: Path | None) -> tuple[Path, Layout]:
    if path is None:
        package = _importable_sglang()
        if package is None:
            raise TargetError(
                "no sglang importable by this interpreter or by python3 on PATH; pass --target"
            )
        return _classify(package.parent, given=package)
    if not path.exists():
        raise TargetError("no such file or directory", str(path))
    if not path.is_dir():
        raise TargetError("not a directory", str(path))
    return _classify(path.resolve(), given=path)


def _classify(folder: Path, given: Path) -> tuple[Path, Layout]:
    """Accept site-packages, the sglang package itself, or a checkout root (or its python/)."""
    if folder.name == "sglang" and _is_package(folder):
        folder = folder.parent
    if (
        folder.name == "python"
        and _is_package(folder / "sglang")
        and (folder.parent / ".git").exists()
    ):
        return folder.parent, Layout.CHECKOUT
    if _is_package(folder / "python" / "sglang"):
        return folder, Layout.CHECKOUT
    if _is_package(folder / "sglang"):
        return folder, Layout.SITE_PACKAGES
    raise TargetError("not an SGLang tree (no sglang package found in it)", str(given))


def _is_package(folder: Path) -> bool:
    return (folder / "__init__.py").is_file() and (folder / "srt").is_dir()


_FIND_SPEC = (
    "import importlib.util as u; s = u.find_spec('sglang'); "
    "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')"
)


def _importable_sglang() -> Path | None:
    """The sglang this interpreter would import; else the one `python3` on PATH would.

    `find_spec` on a top-level name locates the package without running its `__init__`.
    The PATH fallback lets a pipx-installed sglpatch find the user's virtual environment.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    import shutil
    import subprocess

    python3 = shutil.which("python3")
    if python3 is None or Path(python3).resolve() == Path(sys.executable).resolve():
        return None
    try:
        out = subprocess.run(
            [python3, "-c", _FIND_SPEC],
            capture_output=True,
            text=True,
            timeout=30,
            env={**os.environ, "PYTHONSAFEPATH": "1"},
            check=False,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return None
    return Path(out) if out else None


def detect_release(root: Path, layout: Layout) -> tuple[Version | None, str | None]:
    """The release from dist-info, `_version.py`, a `version.py` literal or the checkout's tag."""
    package = root / "python" / "sglang" if layout is Layout.CHECKOUT else root / "sglang"
    in_package = _from_assignment(package / "_version.py") or _from_assignment(
        package / "version.py"
    )
    found = _from_dist_info(package.parent, in_package[0] if in_package else None) or in_package
    if found is not None:
        return found
    if layout is Layout.CHECKOUT:
        return _from_tag(root)
    return None, None


_NAME_RE = re.compile(r"^Name:\s*sglang\s*$", re.IGNORECASE | re.MULTILINE)
_VERSION_RE = re.compile(r"^Version:\s*(\S+)\s*$", re.MULTILINE)


def _from_dist_info(site: Path, in_package: Version | None) -> tuple[Version, str] | None:
    """The installed distribution's version.

    An interrupted upgrade or `pip install --target` can leave two dist-info folders; prefer the
    one that agrees with the package's own version file, else the newest.
    """
    found: list[tuple[Version, str]] = []
    for info in site.glob("sglang-*.dist-info"):
        metadata = info / "METADATA"
        try:
            head = metadata.read_text(encoding="utf-8", errors="replace")[:4096]
        except OSError:
            continue
        match = _VERSION_RE.search(head)
        version = _version_or_none(match.group(1)) if match and _NAME_RE.search(head) else None
        if version is not None:
            found.append((version, str(metadata)))
    agreeing = [f for f in found if f[0] == in_package]
    return (agreeing or sorted(found))[-1] if found else None


def _from_assignment(path: Path) -> tuple[Version, str] | None:
    """A top-level `__version__ = ... = "X"` literal; dynamic code does not count."""
    try:
        tree = ast.parse(path.read_bytes())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
            and isinstance(node.value, ast.Constant)
            and isinstance(node.value.value, str)
        ):
            version = _version_or_none(node.value.value)
            if version is not None:
                return version, str(path)
    return None


def _from_tag(root: Path) -> tuple[Version | None, str | None]:
    """A release tag (`v0.5.9`) on the checkout's HEAD commit."""
    import git  # heavy: only checkouts need it

    try:
        repo = git.Repo(root)
        head = repo.head.commit
    except (git.exc.GitError, ValueError):
        return None, None
    for tag in repo.tags:
        try:
            if tag.commit == head:
                version = _version_or_none(tag.name.removeprefix("v"))
                if version is not None:
                    return version, f"git tag {tag.name}"
        except ValueError:
            continue
    return None, None


def _version_or_none(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None
