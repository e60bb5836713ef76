"""sglpatch: patch an installed SGLang for hardware and models its release does not support yet."""

from __future__ import annotations

__version__ = "0.1.0"
