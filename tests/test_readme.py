"""The README's first steps are true as written on a fresh clone."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import wheels

README = (Path(__file__).resolve().parent.parent / "README.md").read_text()
FIRST_STEPS = README.split("## From a fresh clone")[1].split("\n## ")[0]
# Works before pipx's bin folder is on PATH (tests/test_packaging.py runs it as written).
FIRST_COMMAND = (
    'pipx install . && "$(pipx environment --value PIPX_BIN_DIR)/sglpatch" apply --dry-run'
)


def shell_blocks(text: str) -> list[str]:
    return [b.strip() for b in re.findall(r"```sh\n(.*?)```", text, re.S)]


def test_the_first_command_is_pipx_and_hard_codes_no_release() -> None:
    first = shell_blocks(README)[0]
    assert first == FIRST_COMMAND
    assert "--release" not in first  # a release the reader may not have
    # --release is explained after it, as a check
    assert FIRST_STEPS.index(first) < FIRST_STEPS.index("`--release 0.5.9` is a")


def test_the_system_python_is_never_the_way_to_install() -> None:
    # `python3 -m pip install` / `pip install .` outside a venv of sglpatch's own upgrades shared
    # packages; only a venv's own pip may install sglpatch.
    for line in README.splitlines():
        if re.search(r"\bpip install (\.|sglpatch)", line):
            assert "/bin/pip install ." in line or "RUN pip install ./sglpatch" in line, line
    assert "python3 -m pip install" not in README


def test_the_test_command_says_what_it_downloads() -> None:
    assert shell_blocks(FIRST_STEPS)[1] == "scripts/test"
    text = " ".join(FIRST_STEPS.split())
    assert f"{wheels.RELEASES[0]} to {wheels.RELEASES[-1]} ({len(wheels.RELEASES)} wheels" in text
    assert "SGLPATCH_WHEEL_CACHE=" in text and "once" in text
    said = int(re.search(r"about (\d+) MB", text).group(1))  # type: ignore[union-attr]
    cached = [next(iter(wheels.CACHE.glob(f"sglang-{r}-*.whl")), None) for r in wheels.RELEASES]
    if all(cached):  # with every wheel here, the size stated is the size downloaded (to 10 %)
        total = sum(w.stat().st_size for w in cached if w) / 2**20
        assert abs(total - said) <= said / 10, total


def patch_table() -> dict[str, list[str]]:
    """The README's patch table: id -> its other cells."""
    table = README.split("## The patches")[1].split("\n## ")[0]
    return {
        cells[0].strip("` "): cells[1:]
        for line in table.splitlines()
        if line.startswith("| `") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }


DASH = "\N{EN DASH}"


def releases_cell(releases: list[str]) -> str:
    """Runs of consecutive releases (in the order the tests know them) as `a DASH b, c` (DASH: the en dash the README writes)."""
    runs: list[list[str]] = []
    for release in releases:
        at = wheels.RELEASES.index(release)
        if runs and wheels.RELEASES.index(runs[-1][-1]) == at - 1:
            runs[-1].append(release)
        else:
            runs.append([release])
    return ", ".join(r[0] if len(r) == 1 else f"{r[0]} {DASH} {r[-1]}" for r in runs)


def test_the_patch_table_is_the_catalogue() -> None:
    """One row per patch: where `list --release` says it applies, its description, and the
    release that fixed it upstream."""
    from sglpatch import api, catalogue

    rows = patch_table()
    patches = {p.id: p for p in catalogue.load()}
    assert rows.keys() == patches.keys()
    applies: dict[str, list[str]] = {p: [] for p in patches}
    for release in wheels.RELEASES:
        for row in api.list_patches(release):
            if row.outlook == "applies":
                applies[row.id].append(release)
    for patch_id, (releases, what, upstream) in rows.items():
        patch = patches[patch_id]
        assert releases == releases_cell(applies[patch_id]), patch_id
        assert what == patch.description, patch_id
        fixed = patch.fixed_upstream_in
        assert upstream == ("none yet" if fixed is None else str(fixed)), patch_id


def test_the_releases_cell_joins_runs() -> None:
    first, second, third, *_ = wheels.RELEASES
    assert releases_cell([first, second, third]) == f"{first} {DASH} {third}"
    assert releases_cell([first, third]) == f"{first}, {third}"
