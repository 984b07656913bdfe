"""Global concurrency limits: at most N tasks of a key running at once, across every worker.

A key is a task name (``@app.task(concurrency_limit=2)``), a key computed from a call's
arguments (``concurrency_key=("customer_id",)``, or a function of the arguments), a key given
with the call (``apply_async(concurrency_key="customer:42", concurrency_limit=1)``), or a queue
(the ``queue_concurrency_limits`` setting). The producer writes the key and its limit into the
row's headers; the claim statement itself counts each key's running rows in the
``concurrency_limits`` table and starts a row only while its key has room. A row over its limit
is set BLOCKED: out of the claim index, so it costs other claims nothing and never holds back
rows of other keys or of unlimited tasks. When a running row of its key ends (success, failure,
retry, release, a lost lease taken back), the statement that ends it gives the count back, and
the worker moves that key's blocked rows back to PENDING, oldest and highest priority first.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: The most a limit can be (the claim reads up to nine digits).
MAX_LIMIT = 999_999_999

ConcurrencyKey = Sequence[str] | Callable[..., Any]


def check_limit(value: Any, what: str = "concurrency_limit") -> int | None:
    """A limit as the claim reads it: None (no limit) or a whole number from 1."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{what} must be a whole number of running tasks, not {value!r}")
    if not 1 <= value <= MAX_LIMIT:
        raise ValueError(f"{what} must be from 1 to {MAX_LIMIT}, not {value}")
    return value


def check_queue_limits(limits: Mapping[str, Any] | None) -> dict[str, int]:
    """The ``queue_concurrency_limits`` setting, checked."""
    if not limits:
        return {}
    out: dict[str, int] = {}
    for queue, value in limits.items():
        if not isinstance(queue, str) or not queue:
            raise TypeError(f"queue_concurrency_limits: {queue!r} is not a queue name")
        limit = check_limit(value, f"queue_concurrency_limits[{queue!r}]")
        assert limit is not None or value is None
        if limit is not None:
            out[queue] = limit
    return out


def task_key(task_name: str) -> str:
    """The key of a task limited as a whole."""
    return f"task:{task_name}"


def queue_key(queue: str) -> str:
    """The key of a limited queue."""
    return f"queue:{queue}"
