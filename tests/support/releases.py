"""The SGLang releases the tests use, each named once."""

from __future__ import annotations

# Every published release from 0.5.3 to the newest the catalogue is tested on (sglpatch's
# NEWEST_TESTED; tests/test_catalogue.py checks they agree).
RELEASES = [
    "0.5.3", "0.5.3.post1", "0.5.3.post2", "0.5.3.post3",
    "0.5.4", "0.5.4.post1", "0.5.4.post2", "0.5.4.post3",
    "0.5.5", "0.5.5.post1", "0.5.5.post2", "0.5.5.post3",
    "0.5.6", "0.5.6.post1", "0.5.6.post2",
    "0.5.7", "0.5.8", "0.5.8.post1", "0.5.9", "0.5.10", "0.5.10.post1",
    "0.5.11", "0.5.12", "0.5.12.post1", "0.5.13", "0.5.13.post1", "0.5.14",
    "0.5.15", "0.5.15.post1", "0.5.16", "0.5.17", "0.5.18", "0.5.19",
    "0.5.20", "0.5.21", "0.5.22", "0.5.23",
]  # fmt: skip
OLDEST, NEWEST = RELEASES[0], RELEASES[-1]

# The seed user's release (Kimi K2.5 with EAGLE-3 on RTX PRO 6000s): most tests patch it.
SEED = "0.5.9"
# The release that user upgrades to: four of 0.5.9's patches are upstream there.
UPGRADE = "0.5.10"
