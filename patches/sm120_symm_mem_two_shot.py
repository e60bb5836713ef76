"""Route compute capability 12 to the two-shot kernel in the symmetric-memory communicator.

Why: `all_reduce()` picks the multimem or the two-shot kernel by looking the capability major up
in `_WORLD_SIZES_MULTIMEM`, which knows only 9 and 10, so on capability 12 the lookup raises
`KeyError: 12`. Capability-12 parts have no NVSwitch multicast, so every world size takes the
two-shot kernel: the row is `12: []`.

`all_reduce()` only runs when the communicator is enabled, which needs NVLink multicast (a
non-null multicast pointer from the rendezvous). No capability-12 part has NVLink, so there
SGLang disables the communicator in its constructor and this row is not reached; the patch
keeps a capability-12 system that does expose multicast from the `KeyError`.

Delete when: the oldest release in use is 0.5.14 or newer. 0.5.14 changed the lookup to
`.get(capability, ())`, which sends unknown capabilities to two-shot; there this patch reports
"already upstream" and leaves the file alone.
"""

from __future__ import annotations

from packaging.version import Version

from sglpatch.patch import (
    TESTED,
    AlreadyPresent,
    AlreadyUpstream,
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
TABLE = "_WORLD_SIZES_MULTIMEM"

# 0.5.4.post3 renamed the module and class (symm_mem -> torch_symm_mem).
MODULE = ByRelease(
    {
        "<0.5.4.post3": "srt/distributed/device_communicators/symm_mem.py",
        ">=0.5.4.post3": "srt/distributed/device_communicators/torch_symm_mem.py",
    }
)
COMMUNICATOR = ByRelease(
    {"<0.5.4.post3": "SymmMemCommunicator", ">=0.5.4.post3": "TorchSymmMemCommunicator"}
)


class Sm120SymmMemTwoShot(Patch):
    """Add `12: []` to the communicator's multimem world-size table."""

    id = "sm120-symm-mem-two-shot"
    description = "capability 12 takes the two-shot all-reduce kernel (no NVSwitch multicast)"
    symptom = (
        "--enable-torch-symm-mem dies with KeyError: 12 in all_reduce() on GPUs that expose "
        "NVLink multicast (without it SGLang disables the communicator first)"
    )
    tested = TESTED
    fixed_upstream_in = Version("0.5.14")
    files = MODULE
    concerns = Concerns(flag="--enable-torch-symm-mem")
    # all_reduce() runs only on a communicator with NVLink multicast, which no capability-12
    # part has: the row completes the table.
    effect = Effect.TABLE

    def _class(self, module: cst.Module, release: Version) -> cst.ClassDef:
        name = COMMUNICATOR.get(release)
        if name is None:  # target_file already said None for such a release
            raise AnchorMissing(f"no communicator is known for SGLang {release}")
        return cst_tools.find_class(module, name)

    @staticmethod
    def _tolerant_lookup(communicator: cst.ClassDef) -> bool:
        """`self._WORLD_SIZES_MULTIMEM.get(capability, default)`: unknown majors are fine."""
        calls = cst_tools.method_calls_on(communicator, TABLE, "get")
        return bool(calls) and all(len(call.args) == 2 for call in calls)

    def transform(self, module: cst.Module, release: Version) -> cst.Module:
        communicator = self._class(module, release)
        table = cst_tools.find_dict(cst_tools.class_body(communicator), TABLE)
        # The row check is cheap; the lookup check walks the whole class, so it comes second.
        if cst_tools.dict_row(table, NEW) is not None:
            raise AlreadyPresent(f"{TABLE} has a row for capability {NEW}")
        if self._tolerant_lookup(communicator):
            raise AlreadyUpstream(
                f"{TABLE} is read with .get(capability, default): capability {NEW} "
                "already takes the two-shot kernel"
            )
        model = cst_tools.dict_row(table, MODEL)
        if model is None:
            raise AnchorMissing(f"{TABLE} has no row for capability {MODEL} to follow")
        row = model.deep_clone().with_changes(key=cst.Integer(str(NEW)), value=cst.List([]))
        return cst_tools.replace(module, table, cst_tools.with_row_after(table, MODEL, row))

    def postcondition(self, module: cst.Module, release: Version) -> None:
        communicator = self._class(module, release)
        table = cst_tools.find_dict(cst_tools.class_body(communicator), TABLE)
        row = cst_tools.dict_row(table, NEW)
        if row is not None and isinstance(row.value, cst.List):
            return
        if not self._tolerant_lookup(communicator):
            raise PostconditionFailed(f"{TABLE} has no world-size list for capability {NEW}")
