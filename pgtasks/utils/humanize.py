"""Numbers as people read them, for the terminal commands and the dashboard."""

from __future__ import annotations

from typing import Any


def duration(seconds: Any) -> str:
    """A wait or a duration: ``12 s``, ``4m05s``, ``3h20m``, ``2d04h`` (``-`` for none)."""
    if seconds is None:
        return "-"
    s = max(0, int(seconds))
    if s < 60:
        return f"{s} s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
