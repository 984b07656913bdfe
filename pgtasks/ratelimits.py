"""Celery's ``rate_limit``, held across every worker by the database.

A rate such as ``"10/m"`` becomes an interval between task starts (6 s). Each rate-limited task
name owns a row in ``rate_limits`` whose ``next_at`` is the next free start time. The worker
names its rate-limited tasks and their intervals in every claim, and the claim statement gives
each such row it picks the next slot: a slot already due runs now; a later one leaves the row
PENDING, due at its slot and marked as admitted, so whichever worker claims it then runs it
without asking again. Slots are one interval apart whichever worker takes them: the limit is
global, where Celery's is per worker. A row waiting for its slot holds no concurrency-limit place.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any

#: Header marking a row that holds its slot (set when it is handed back to wait for it).
ADMITTED = "rate_slot"

_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0}


@lru_cache(maxsize=256)
def _parse(value: str) -> float:
    text = value.strip()
    number, _, unit = text.partition("/")
    try:
        count = float(number)
    except ValueError:
        raise ValueError(
            f"invalid rate limit {value!r}: use a number of tasks per second, or "
            f"'N/s', 'N/m' or 'N/h'"
        ) from None
    unit = unit.strip().lower()[:1] or "s"
    if unit not in _UNITS:
        raise ValueError(f"invalid rate limit {value!r}: the unit must be s, m or h")
    if count < 0:
        raise ValueError(f"invalid rate limit {value!r}: the rate cannot be negative")
    return count / _UNITS[unit]


def rate(value: Any) -> float:
    """Tasks per second for a Celery rate limit (``"100/m"``, ``"5/s"``, ``"2/h"``, ``10``).

    ``None``, ``0`` and ``""`` mean no limit (0.0), as in Celery.
    """
    if value is None or value == "":
        return 0.0
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        if value < 0:
            raise ValueError(f"invalid rate limit {value!r}: the rate cannot be negative")
        return float(value)
    if isinstance(value, str):
        return _parse(value)
    raise TypeError(f"rate limit must be a string such as '10/m' or a number, not {value!r}")


def interval(value: Any) -> float | None:
    """Seconds between starts for a rate limit, or None when it does not limit anything."""
    per_second = rate(value)
    return 1.0 / per_second if per_second > 0 else None


def key(task_name: str) -> str:
    """The ``rate_limits`` row a task name draws its slots from."""
    return f"task:{task_name}"


def admitted(headers: dict[str, Any]) -> bool:
    """Whether a claimed row already holds its slot (it waited for it, and it is due now)."""
    return ADMITTED in headers
