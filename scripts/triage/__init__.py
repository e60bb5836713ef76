"""The parts of `scripts/sm120_triage.py` (the command line stays there): which changed lines
matter (`patterns`, `branches`), the hunks of each pair of releases (`diff`), the human verdicts
(`verdicts`) and the Markdown they make (`document`); `errors` is the one way the script stops."""
