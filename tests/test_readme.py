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


def test_the_patch_table_has_one_row_per_patch_with_its_upstream_fix() -> None:
    from sglpatch import catalogue

    table = README.split("## The patches")[1].split("\n## ")[0]
    rows = {
        cells[0].strip("` "): cells[-1].strip()
        for line in table.splitlines()
        if line.startswith("| `") and (cells := [c.strip() for c in line.strip("|").split("|")])
    }
    patches = {p.id: p for p in catalogue.load()}
    assert rows.keys() == patches.keys()
    for patch_id, upstream in rows.items():
        fixed = patches[patch_id].fixed_upstream_in
        if fixed is None:
            assert upstream == "none yet", patch_id
        else:
            assert upstream.startswith(str(fixed)), (patch_id, upstream, fixed)
