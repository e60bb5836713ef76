"""What the commands do, as plain functions returning report values; no terminal code here.

One module per command, mirroring `sglpatch.cli`: `apply` (with `preview`), `revert`, `status`
(with `check` and `log`), `catalogue` (`list_patches`, `export`), `doctor` (`diagnose`);
`common` holds what several of them need. Plugins and scripts import from here.
"""

from __future__ import annotations

from sglpatch.api.apply import apply, preview
from sglpatch.api.catalogue import export, list_patches
from sglpatch.api.doctor import diagnose
from sglpatch.api.revert import revert
from sglpatch.api.status import check, log, status
from sglpatch.reports import (
    ApplyReport,
    CatalogueRow,
    CheckReport,
    DoctorReport,
    ExportReport,
    LogReport,
    PatchStatus,
    Preview,
    RevertReport,
    StatusReport,
)

__all__ = [
    "ApplyReport",
    "CatalogueRow",
    "CheckReport",
    "DoctorReport",
    "ExportReport",
    "LogReport",
    "PatchStatus",
    "Preview",
    "RevertReport",
    "StatusReport",
    "apply",
    "check",
    "diagnose",
    "export",
    "list_patches",
    "log",
    "preview",
    "revert",
    "status",
]
