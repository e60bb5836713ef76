"""Finding the SGLang to patch and knowing its release, without importing it (it pulls in torch)."""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import NamedTuple

from packaging.version import InvalidVersion, Version

from sglpatch.errors import RefusedError, TargetError, UsageError
from sglpatch.reading import read_regular
from sglpatch.release import inferred, read_release


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
    found_by: str | None = None  # how discovery found it when no --target was given
    also_found: tuple[str, ...] = ()  # other SGLang installs discovery saw, each "path (how)"
    # The site-packages `--target` named when it led to a checkout (an editable install's):
    # the environment that runs this tree, whose kernels doctor reads.
    environment: Path | None = None

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


def parse_release(text: str, option: str = "--release") -> Version:
    """`text` as a release; `option` names what the user typed in the error."""
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"{option} {text!r} is not a release number (e.g. 0.5.9)") from None


def find_target(path: Path | None, requested: Version | None, *, required: bool = True) -> Target:
    """Resolve `--target` (or the active interpreter's sglang) and settle the release.

    `requested` is `--release`: if the target's own release differs, refuse and name both.
    With `required`, a release that is neither found nor given is a usage error.
    """
    found_by: str | None = None
    also: tuple[str, ...] = ()
    if path is None:
        first, *others = discover()
        path, found_by = first.package, first.how
        also = tuple(f"{o.package.parent} ({o.how})" for o in others)
    root, layout, environment = _locate(path)
    found, source = detect_release(root, layout)
    if requested is not None and found is not None and requested != found and inferred(source):
        # Only guessed (a development version, commits past a tag, files that disagree): the
        # user's word for it wins, and the source keeps what the tree itself says.
        found, source = requested, f"--release {requested}; the tree: {source}"
    if requested is not None and found is not None and requested != found:
        raise RefusedError(  # neutral: the option may be the deprecated --version
            f"SGLang {requested} was asked for, but the target's release is {found} "
            f"(from {source}); drop the release asked for or point --target elsewhere"
        )
    if requested is None and found is None and required:
        raise UsageError(
            f"cannot tell which SGLang release {root} is (no dist-info, version file or "
            "release tag could be read); pass --release"
        )
    release = requested if found is None else found
    source = source if found is not None else ("--release" if requested else None)
    return Target(root, layout, release, source, found_by, also, environment)


def _locate(path: Path) -> tuple[Path, Layout, Path | None]:
    """The tree `path` names, its layout, and the site-packages it was reached through when
    that is not the tree itself (an environment or site-packages with an editable install)."""
    if not path.exists():
        raise TargetError("no such file or directory", str(path))
    if not path.is_dir():
        raise TargetError("not a directory", str(path))
    found = _environment_package(path)
    if found is not None:
        package, site = found
        root, layout = _classify(package.parent, given=path)
        return root, layout, site if layout is Layout.CHECKOUT else None
    if not _is_package(path / "sglang"):
        editable = _editable_package(path)
        if editable is not None:
            root, layout = _classify(editable.parent, given=path)
            return root, layout, path.resolve()
    root, layout = _classify(path.resolve(), given=path)
    return root, layout, None


def _classify(folder: Path, given: Path) -> tuple[Path, Layout]:
    """Accept site-packages, the sglang package itself, or a checkout root (or its python/)."""
    if folder.name == "sglang" and _is_package(folder):
        folder = folder.parent
    if (
        folder.name == "python"
        and _is_package(folder / "sglang")
        # the repository's python/ folder, as an editable install of a checkout points at it
        and ((folder.parent / ".git").exists() or (folder / "pyproject.toml").is_file())
    ):
        return folder.parent, Layout.CHECKOUT
    if _is_package(folder / "python" / "sglang"):
        return folder, Layout.CHECKOUT
    if _is_package(folder / "sglang"):
        return folder, Layout.SITE_PACKAGES
    raise TargetError("not an SGLang tree (no sglang package found in it)", str(given))


def _is_package(folder: Path) -> bool:
    try:
        return (folder / "__init__.py").is_file() and (folder / "srt").is_dir()
    except PermissionError as error:  # Python 3.11's Path.is_file raises where it may not look
        if not os.path.isdir(folder):  # noqa: PTH112 - a folder above is closed: not the target
            return False
        raise TargetError(f"cannot look into it: {error.strerror}", str(folder)) from None


class Found(NamedTuple):
    """An sglang package discovery saw, and how (which environment or interpreter)."""

    package: Path
    how: str


# Asked of another interpreter: its prefix, then where it would import sglang from. `find_spec`
# on a top-level name runs no package code, and it follows editable installs (`.pth` files and
# setuptools' import hooks) to the checkout they point at.
_ASK = (
    "import importlib.util as u, sys; s = u.find_spec('sglang'); print(sys.prefix); "
    "print(s.submodule_search_locations[0] if s and s.submodule_search_locations else '')"
)


def discover() -> list[Found]:
    """Every distinct sglang that could be meant, most specific first; the first is used.

    1. the active environment: `$VIRTUAL_ENV`, then `$CONDA_PREFIX`, asked through its own
       interpreter (never by guessing a `python3.X` folder);
    2. the current folder or the nearest folder above it that is an SGLang tree, as git finds
       its repository (see `_around_here`): standing in a tree is a choice made for this
       command, where the interpreters below are whatever the shell happens to have;
    3. the interpreter running sglpatch, unless it is an isolated pipx environment;
    4. `python3` on `PATH`.
    No interpreter is skipped for looking like this one: two virtual environments made from one
    Python share a resolved executable (comparing executables once hid the user's environment).
    Each is asked and names itself by its `sys.prefix`; answers are merged by sglang folder. A
    tree found from the current folder that an interpreter also imports keeps the interpreter's
    name, at the current folder's place: it says which environment runs it (doctor reads that
    environment's kernels).
    """
    import shutil

    labels: list[str] = []
    commands: list[list[str]] = []
    for variable in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        prefix = os.environ.get(variable)
        if prefix:
            labels.append(f"${variable}")
            commands.append([str(Path(prefix) / "bin" / "python"), "-c", _ASK])
    environments = len(commands)
    python3 = shutil.which("python3")
    if python3 is not None:
        labels.append("python3 on PATH")
        commands.append([python3, "-c", _ASK])
    answers = _ask_all(commands)  # started together; this Python is asked meanwhile
    found = [
        Found(answer[1], f"{label} at {answer[0]}")
        for label, answer in zip(labels, answers, strict=True)
        if answer is not None
    ]
    on_path = python3 is not None and answers[-1] is not None
    if not _isolated_pipx(Path(sys.prefix)):
        spec = importlib.util.find_spec("sglang")
        if spec is not None and spec.submodule_search_locations:
            package = Path(next(iter(spec.submodule_search_locations)))
            found.insert(len(found) - on_path, Found(package, f"this Python at {sys.prefix}"))
    here = _around_here()
    if here is not None:  # after the active environments' answers
        found.insert(sum(a is not None for a in answers[:environments]), here)
    distinct: dict[Path, Found] = {}
    for item in found:
        key = item.package.resolve()
        if key not in distinct or distinct[key] is here:
            distinct[key] = item  # a key assigned again keeps its place
    if not distinct:
        raise TargetError(
            "no SGLang found: none in $VIRTUAL_ENV or $CONDA_PREFIX, none in the current folder "
            "or above it, none importable by this Python or by python3 on PATH; activate "
            "SGLang's environment, change to its checkout or pass --target (its site-packages, "
            "environment root or checkout)"
        )
    return list(distinct.values())


def _around_here() -> Found | None:
    """The SGLang tree the current folder is in: the folder itself or the nearest one above it
    that is a checkout (holding `python/sglang/`) or a site-packages holding `sglang/`, up to
    the filesystem's root. Found as `--target` would accept it, so inside a checkout's package
    the checkout is found, not its `python/` folder."""
    try:
        here = Path.cwd()
    except OSError:  # the current folder was removed
        return None
    for folder in (here, *here.parents):
        try:
            root, layout = _classify(folder, given=folder)
        except (TargetError, OSError):  # not a tree, or one this user may not look into
            continue
        package = root / "python" / "sglang" if layout is Layout.CHECKOUT else root / "sglang"
        how = "the current folder" if root == here else f"the current folder's parent {root}"
        return Found(package, how)
    return None


def _ask_all(commands: list[list[str]]) -> list[tuple[str, Path] | None]:
    """Run the interpreters at once; each answers (sys.prefix, sglang folder) or nothing."""
    import subprocess

    env = {**os.environ, "PYTHONSAFEPATH": "1"}  # the current folder must not shadow sglang
    running: list[subprocess.Popen[str] | None] = []
    for argv in commands:
        try:
            running.append(
                subprocess.Popen(
                    argv,
                    stdin=subprocess.DEVNULL,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    text=True,
                    env=env,
                )
            )
        except OSError:  # no such interpreter: that environment holds nothing
            running.append(None)
    answers: list[tuple[str, Path] | None] = []
    for process in running:
        answers.append(None)
        if process is None:
            continue
        try:
            out, _ = process.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            continue
        lines = out.splitlines()
        if process.returncode == 0 and len(lines) >= 2 and lines[-1].strip():
            answers[-1] = (lines[-2].strip(), Path(lines[-1].strip()))
    return answers


def _isolated_pipx(prefix: Path) -> bool:
    """A venv that pipx made for sglpatch alone: what it imports is never the user's SGLang."""
    if not (prefix / "pipx_metadata.json").is_file():
        return False
    try:  # a few lines; a FIFO there is not waited on
        config = read_regular(prefix / "pyvenv.cfg", 1 << 20).decode("utf-8", errors="replace")
    except OSError:
        return True
    return not re.search(r"^include-system-site-packages\s*=\s*true\s*$", config, re.I | re.M)


def _environment_package(root: Path) -> tuple[Path, Path | None] | None:
    """The sglang of a virtual environment or conda root given as --target, and the
    environment's site-packages; None when `root` is no environment.

    Its interpreter is asked first (it knows editable installs); without one, the single
    `lib/python3.*/site-packages/sglang`, or the checkout an editable install there names.
    """
    sites = sorted(root.glob("lib/python3.*/site-packages"))
    if not sites:
        return None
    python = root / "bin" / "python"
    if python.exists():
        (answer,) = _ask_all([[str(python), "-c", _ASK]])
        if answer is not None:
            return answer[1], sites[0].resolve()
    packages = [
        (site / "sglang" if _is_package(site / "sglang") else _editable_package(site), site)
        for site in sites
    ]
    found = [(package, site.resolve()) for package, site in packages if package is not None]
    if len(found) == 1:
        return found[0]
    if found:
        raise TargetError(
            f"holds several SGLang installs ({', '.join(str(p) for p, _ in found)}); pass one "
            "of them",
            str(root),
        )
    raise TargetError("an environment without SGLang in its site-packages", str(root))


def _editable_package(site: Path) -> Path | None:
    """The sglang package an editable install in the site-packages `site` points at.

    pip records where it installed from in the dist-info's `direct_url.json` (PEP 610:
    `dir_info.editable`); setuptools' older editable mode, and a hand-made install, add the
    checkout's `python/` folder to a `.pth` file instead. Read, never executed: a `.pth` line
    that imports a finder is skipped (`direct_url.json` names the same folder).
    """
    import json
    from urllib.parse import unquote, urlparse

    folders: list[Path] = []
    for record in sorted(site.glob("sglang-*.dist-info/direct_url.json")):
        try:
            data = json.loads(read_regular(record, 1 << 16))
        except (OSError, ValueError, RecursionError):
            continue
        if not isinstance(data, dict) or not isinstance(data.get("dir_info"), dict):
            continue
        url = urlparse(str(data.get("url", "")))
        if url.scheme == "file" and data["dir_info"].get("editable") is True:
            folders.append(Path(unquote(url.path)))
    for pth in sorted(site.glob("*.pth")):
        try:
            lines = read_regular(pth, 1 << 20).decode("utf-8", errors="replace").splitlines()
        except OSError:
            continue
        folders += [
            Path(os.path.abspath(site / line.strip()))  # noqa: PTH100 - as site.py, links kept
            for line in lines
            if line.strip() and not line.startswith(("#", "import ", "import\t"))
        ]
    for folder in folders:
        for package in (folder / "sglang", folder / "python" / "sglang"):
            try:
                if _is_package(package):
                    return package
            except OSError:  # a folder this user may not look into
                continue
    return None


def detect_release(root: Path, layout: Layout) -> tuple[Version | None, str | None]:
    """The release from dist-info, `_version.py`, a `version.py` literal or the checkout's tag."""
    package = root / "python" / "sglang" if layout is Layout.CHECKOUT else root / "sglang"
    return read_release(package, root if layout is Layout.CHECKOUT else None)
