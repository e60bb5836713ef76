"""The one exception the triage stops with."""

from __future__ import annotations


class TriageError(Exception):
    """A reason the script stops, shown as one line; `code` is the exit status (2: a bad value)."""

    def __init__(self, message: str, code: int = 2) -> None:
        super().__init__(message)
        self.code = code
