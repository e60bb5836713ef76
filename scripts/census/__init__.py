"""The parts of `scripts/sm120_census.py` (the command line stays there): each release's own
choices on stand-in devices (`cells`), the ones capability 12 cannot run with their verdicts
(`gaps`), and the Markdown they make (`document`)."""
