"""What a patch's codemod answers instead of a changed tree: the exceptions of the patch contract.

They are answers, not failures of sglpatch (those are `errors.py`'s family): the engine turns each
into a result value (`AlreadyApplied`, `NotApplicable`, `Failed`). `patch.py` and `cst_tools`
both raise them, so they live below both; patch modules and plugins import them from
`sglpatch.patch`, which re-exports them.
"""

from __future__ import annotations


class AnchorMissing(Exception):
    """The code a patch edits is not where it should be; the patch never guesses (cf. SkipFile)."""


class AlreadyPresent(Exception):
    """The patch's change is already in the file: ours from an earlier apply, or upstream's."""


class AlreadyUpstream(Exception):
    """Upstream solved the problem its own way; the file must not be touched."""


class PostconditionFailed(Exception):
    """The transformed file does not have the property the patch promises."""


# What a patch's `transform` and `postcondition` may raise as an answer rather than a fault.
EXPECTED: tuple[type[BaseException], ...] = (
    AnchorMissing,
    AlreadyPresent,
    AlreadyUpstream,
    PostconditionFailed,
)
