"""A release's own start-up resolution run on a stand-in GPU: which backends it gives a model.

`Resolver(files, capability).evaluate_config(config, quantization)` runs the release's
`ServerArgs` steps (or their 0.5.19+ hooks) from its source, in a sandbox of stand-ins, and
returns an `Outcome`: the backends chosen, the release's own refusal, or why it could not be
evaluated. `tree_files(package_dir)` gives the files of an SGLang on disk.
"""

from __future__ import annotations

from sglpatch.doctor.resolve.files import ReleaseFiles, tree_files
from sglpatch.doctor.resolve.model import CHECKPOINTS, MODEL_CONFIG
from sglpatch.doctor.resolve.resolution import FIELDS, Outcome, Resolver
from sglpatch.doctor.resolve.sandbox import run_whole

__all__ = [
    "CHECKPOINTS",
    "FIELDS",
    "MODEL_CONFIG",
    "Outcome",
    "ReleaseFiles",
    "Resolver",
    "run_whole",
    "tree_files",
]
