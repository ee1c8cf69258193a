"""A problem a tool found, and the command that fixes it."""

from __future__ import annotations

from dataclasses import dataclass

#: A problem: the command exits 1.
ERROR = "error"
#: Worth knowing, not a problem (e.g. items of versions a cleanup deleted).
INFO = "info"


@dataclass(frozen=True)
class Finding:
    """One problem. ``kind`` is a stable code (see the README's Operators section);
    ``fix`` is the exact command (or action) that resolves it."""

    kind: str
    detail: str
    fix: str
    version: int | None = None
    path: str | None = None
    severity: str = ERROR
