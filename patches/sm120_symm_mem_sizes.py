"""Give compute capability 12 a row in the symmetric-memory all-reduce size table.

Why: the torch symmetric-memory communicator looks its device's capability major up in this table,
which knows only 9 (Hopper) and 10 (B200/GB200). Blackwell workstation parts (RTX PRO 6000,
RTX 5090, GB10) report 12. Through 0.5.13 the lookup is a plain subscript and
`--enable-torch-symm-mem` dies with `KeyError: 12`; from 0.5.14 it is a `.get()` and the
communicator silently stays disabled. Capability 12 gets the world sizes and buffer sizes of 10.

What it does not do: make symmetric memory fast on capability 12. The communicator needs NVLink
multicast, and no capability-12 part has NVLink. With the row in place SGLang builds the
communicator, finds the rendezvous' multicast pointer null, logs "multicast operations are not
supported", turns the communicator off and all-reduces another way (measured on RTX PRO 6000s
with torch 2.11: `KeyError: 12` before, that warning after). The patch turns a crash at start-up
into SGLang's own fallback.

Delete when: an SGLang release ships a row for 12 (none up to 0.5.23 does).
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AnchorMissing,
    ByRelease,
    Concerns,
    Effect,
    Patch,
    PostconditionFailed,
    cst,
    cst_tools,
)

NEW, MODEL = 12, 10

# The same module on every release (an empty specifier matches them all).
FILE = ByRelease({"": "srt/distributed/device_communicators/all_reduce_utils.py"})

# The table was renamed when the communicator became TorchSymmMemCommunicator.
TABLE = ByRelease(
    {
        "<0.5.4.post3": "SYMM_MEM_ALL_REDUCE_MAX_SIZES",
        ">=0.5.4.post3": "TORCH_SYMM_MEM_ALL_REDUCE_MAX_SIZES",
    }
)


class Sm120SymmMemSizes(Patch):
    """Add capability 12 to the all-reduce max-size table, copying capability 10's row."""

    id = "sm120-symm-mem-sizes"
    description = (
        "symmetric-memory all-reduce sizes for capability 12 (RTX PRO 6000, 5090, GB10); "
        "without NVLink multicast SGLang then turns the communicator off"
    )
    symptom = (
        "--enable-torch-symm-mem dies with KeyError: 12 (from 0.5.14: the communicator is "
        "silently disabled)"
    )
    tested = TESTED
    files = FILE
    concerns = Concerns(flag="--enable-torch-symm-mem")
    # From 0.5.14 the communicator ends up off with or without the row on every capability-12
    # part (no NVLink multicast): there the row only completes the table.
    effect = ByRelease({"<0.5.14": Effect.RUN, ">=0.5.14": Effect.TABLE})

    def _table(self, module: cst.Module, release: Version) -> cst.Dict:
        name = TABLE.get(release)
        if name is None:  # every tested release has a row; --force may run others
            raise AnchorMissing(f"no table name is known for SGLang {release}")
        return cst_tools.find_dict(module.body, name)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        table = self._table(module, release)
        if cst_tools.dict_row(table, NEW) is not None:
            raise AlreadyPresent(f"the table has a row for capability {NEW}")
        model = cst_tools.dict_row(table, MODEL)
        if model is None:
            raise AnchorMissing(f"the table has no row for capability {MODEL} to copy")
        row = model.deep_clone().with_changes(key=cst.Integer(str(NEW)))
        return cst_tools.replace(module, table, cst_tools.with_row_after(table, MODEL, row))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        # Upstream may one day choose its own sizes for 12; any row ends the KeyError.
        row = cst_tools.dict_row(self._table(module, release), NEW)
        if row is None or not isinstance(row.value, cst.Dict):
            raise PostconditionFailed(f"no size row for capability {NEW}")
