"""The maintainer's scripts: each regenerates or checks a document under docs/.

They are modules of this package, run from the repository root, where Python finds both this
package and the development helpers in `tests.support` (the wheels, the releases, the census
sandbox) without anyone editing `sys.path`:

    .venv/bin/python -m scripts.sm120_triage --check

Run as a file (`.venv/bin/python scripts/sm120_triage.py`, as the documents say), a script
hands itself over to that form at once (`os.execv`, same arguments, same folder, the repository
root on `PYTHONPATH`): Python puts the file's own folder first on `sys.path` instead, where
neither package is found.
"""
