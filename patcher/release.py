"""Which release an sglang package is, read from the files beside and inside it (never by
importing it): its dist-info, its version file, or a checkout's release tag.

A development version is read as the release it follows: setuptools-scm writes `0.5.24.dev1+g…`
into `_version.py` one commit past the tag `v0.5.23` (its default scheme guesses the next
release), and the patches for that tree are 0.5.23's. The same tree without a version file is
`git describe`'s `v0.5.23-1-g…`. Either way the release is 0.5.23 and the source says how far
past it the tree is, so apply, status and doctor agree on it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch.reading import read_regular


def read_release(package: Path, checkout: Path | None) -> tuple[Version | None, str | None]:
    """The release of the sglang `package` and where it was read (None, None: nowhere).

    The dist-info beside it, then `_version.py` or a `version.py` literal, then, for a
    `checkout` (the repository's root), its release tag as `git describe` finds it. A
    development version (`0.5.24.dev1`) is the release it follows: the checkout's tag when
    there is one, else the one setuptools-scm's guess counted from (0.5.23).
    """
    in_package = _from_assignment(package / "_version.py") or _from_assignment(
        package / "version.py"
    )
    found = _from_dist_info(package.parent, in_package[0] if in_package else None) or in_package
    tag = _from_tag(checkout) if checkout is not None else (None, None)
    if found is not None and found[0].is_devrelease:
        return _after(found, tag)
    if found is not None and tag[0] is not None and tag[0] != found[0]:
        # A version file left from an older install (the tree was pulled since), or a release
        # bump committed before its tag: either way the newer names the source.
        newer, older = (tag, found) if tag[0] > found[0] else (found, tag)
        return newer[0], f"{newer[1]}; {older[1]} says {older[0]}{_DISAGREE}"
    if found is not None:
        return found
    return tag


def _after(dev: tuple[Version, str], tag: tuple[Version | None, str | None]) -> tuple[Version, str]:
    """The release a development version follows, and the source saying so."""
    version, where = dev
    said = f"{where}: {version}{_DEVELOPMENT} after"
    if tag[0] is not None:  # HEAD's tag: the version file was written at install time
        return tag[0], f"{said} {tag[0]} ({tag[1]})"
    before = _release_before(version)
    if before is None:  # 0.6.0.dev1: the release it follows cannot be told from the number
        return version, f"{where}: {version}{_DEVELOPMENT}"
    return before, f"{said} {before}"


def _release_before(version: Version) -> Version | None:
    """What setuptools-scm's default scheme counted from: one was added to the last part of the
    tag's version (`0.5.23` -> `0.5.24.dev1`, `0.5.10.post1` -> `0.5.10.post2.dev1`, `0.5.24rc0`
    -> `0.5.24rc1.dev1`); None where that part was 0 (the tag cannot be told)."""
    base = version.base_version  # without .devN and +local
    if version.post is not None:
        before = version.post - 1
        stem = base.rsplit(".post", 1)[0]
        return Version(f"{stem}.post{before}") if before > 0 else None
    if version.pre is not None:
        letter, number = version.pre
        stem = ".".join(str(n) for n in version.release)
        return Version(f"{stem}{letter}{number - 1}") if number > 0 else None
    *head, last = version.release
    if last == 0:
        return None
    return Version(".".join(str(n) for n in (*head, last - 1)))


def inferred(source: str | None) -> bool:
    """Whether a release was inferred (a dev version, commits past a tag), not read as such:
    the commands say so, as a warning, where they name the release."""
    return source is not None and any(word in source for word in (_DEVELOPMENT, _PAST, _DISAGREE))


_DEVELOPMENT = ", a development version"
_PAST = " past the tag"
_DISAGREE = " (they disagree: the newer is taken)"


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
    """The newest release tag (`v0.5.9`) at or before the checkout's HEAD, as `git describe`
    finds it; (None, None) when the repository cannot say, whatever is wrong with it (no git on
    PATH, no tag, a corrupt repository): never an error of the command.

    A HEAD past its tag is that release with commits on top (a fix, a local change): the
    patches for it are the tag's, and the source says how far past it is.
    """
    import subprocess  # git itself, not gitpython: `status` pays a process, not an import

    try:
        done = subprocess.run(
            ["git", "-C", str(root), "describe", "--tags", "--long", "--match", "v[0-9]*", "HEAD"],
            capture_output=True,
            stdin=subprocess.DEVNULL,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None, None
    described = done.stdout.decode("utf-8", errors="replace").strip()
    match = _DESCRIBED_RE.match(described) if done.returncode == 0 else None
    version = _version_or_none(match.group("tag").removeprefix("v")) if match else None
    if match is None or version is None:
        return None, None
    tag, past = match.group("tag"), int(match.group("past"))
    if past == 0:
        return version, f"git tag {tag}"
    commits = f"{past} commit{'s' * (past > 1)}"
    return version, f"git describe: {described}, {commits}{_PAST}"


# `git describe --long`: the tag, the commits since it, `g` and HEAD's abbreviated hash.
_DESCRIBED_RE = re.compile(r"^(?P<tag>.+)-(?P<past>\d+)-g[0-9a-f]+$")


_VERSION_FILE_LIMIT = 1 << 20  # bytes: a version file is a few lines


def _version_or_none(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None
