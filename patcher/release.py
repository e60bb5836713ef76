"""Which release an sglang package is, read from the files beside and inside it (never by
importing it): its dist-info, its version file, or a checkout's release tag."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch.reading import read_regular


def read_release(package: Path, checkout: Path | None) -> tuple[Version | None, str | None]:
    """The release of the sglang `package` and where it was read (None, None: nowhere).

    The dist-info beside it, then `_version.py` or a `version.py` literal, then, for a
    `checkout` (the repository's root), the tag on its HEAD commit.
    """
    in_package = _from_assignment(package / "_version.py") or _from_assignment(
        package / "version.py"
    )
    found = _from_dist_info(package.parent, in_package[0] if in_package else None) or in_package
    if found is not None:
        return found
    if checkout is not None:
        return _from_tag(checkout)
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
            head = read_regular(metadata, 4096, whole=False).decode("utf-8", errors="replace")
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
        tree = ast.parse(read_regular(path, _VERSION_FILE_LIMIT))
    except (OSError, SyntaxError, ValueError, RecursionError, MemoryError):
        # RecursionError, MemoryError: an expression too long or too deeply nested for the
        # parser. Either way the file holds no literal this can read.
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
    """A release tag (`v0.5.9`) on the checkout's HEAD commit; (None, None) when the repository
    cannot say, whatever is wrong with it."""
    import git  # heavy: only checkouts need it

    try:
        repo = git.Repo(root)
    except Exception:  # see below
        return None, None
    try:
        head = repo.head.commit
        for tag in repo.tags:
            try:
                if tag.commit != head:
                    continue
            except Exception:  # a tag whose ref or object is broken: the others may do
                continue
            version = _version_or_none(tag.name.removeprefix("v"))
            if version is not None:
                return version, f"git tag {tag.name}"
    except Exception:
        # A corrupt repository (a broken `.git/config`, refs or objects) surfaces as whatever
        # gitpython's parsers or its `git cat-file` process raise: GitError, ValueError, or a
        # BrokenPipeError when git exits before reading the request. All of them mean the
        # release cannot be read from the tag, never an error of the command.
        return None, None
    finally:
        repo.close()  # its `git cat-file` processes
    return None, None


_VERSION_FILE_LIMIT = 1 << 20  # bytes: a version file is a few lines


def _version_or_none(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None
