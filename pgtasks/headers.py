"""The message headers that producers write and workers read, by name, with what builds them
from a call's options. A leaf both sides import: a producer needs no worker module to enqueue.
"""

from __future__ import annotations

import math
import reprlib
from typing import Any

#: A call's own time limits, as Celery's protocol v2 names the header: [hard, soft].
TIMELIMIT = "timelimit"
#: A call's concurrency key and its limit (read by the claim through the schema's
#: concurrency_key() function).
CONCURRENCY_KEY = "concurrency_key"
CONCURRENCY_LIMIT = "concurrency_limit"


def timelimit(time_limit: Any, soft_time_limit: Any) -> list[float | None] | None:
    """The ``timelimit`` header value for a call's own limits (None when it sets neither).
    Raises TypeError or ValueError, naming the option, for what is not a number of seconds."""
    if time_limit is None and soft_time_limit is None:
        return None
    return [_seconds("time_limit", time_limit), _seconds("soft_time_limit", soft_time_limit)]


def _seconds(option: str, value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TypeError(f"{option} must be a number of seconds, not {type(value).__name__}")
    try:
        seconds = float(value)
    except OverflowError:
        seconds = math.inf
    if not 0 <= seconds < math.inf:
        raise ValueError(
            f"{option} must be a finite number of seconds, at least 0, not {reprlib.repr(value)}"
        )
    return seconds
