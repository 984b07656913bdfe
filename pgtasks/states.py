"""Task states: the rows' statuses and Celery's state names, and the mapping between them."""

from __future__ import annotations

# Celery's state names, as AsyncResult.state reports them.
PENDING = "PENDING"
RECEIVED = "RECEIVED"
STARTED = "STARTED"
SUCCESS = "SUCCESS"
FAILURE = "FAILURE"
REVOKED = "REVOKED"
REJECTED = "REJECTED"
RETRY = "RETRY"
IGNORED = "IGNORED"

READY_STATES = frozenset({SUCCESS, FAILURE, REVOKED})
UNREADY_STATES = frozenset({PENDING, RECEIVED, STARTED, REJECTED, RETRY})
EXCEPTION_STATES = frozenset({RETRY, FAILURE, REVOKED})
PROPAGATE_STATES = frozenset({FAILURE, REVOKED})
ALL_STATES = frozenset({PENDING, RECEIVED, STARTED, SUCCESS, FAILURE, RETRY, REVOKED})

# Celery's order of states, most final first (None stands for any custom state).
PRECEDENCE = [SUCCESS, FAILURE, None, REVOKED, STARTED, RECEIVED, REJECTED, RETRY, PENDING]
PRECEDENCE_LOOKUP = {name: index for index, name in enumerate(PRECEDENCE)}
NONE_PRECEDENCE = PRECEDENCE_LOOKUP[None]


def precedence(name: str | None) -> int:
    """A state's rank in Celery's order (lower is more final); custom states rank as None."""
    return PRECEDENCE_LOOKUP.get(name, NONE_PRECEDENCE)


class state(str):
    """A state name that compares by precedence: ``state(SUCCESS) > state(PENDING)``."""

    def __gt__(self, other: object) -> bool:
        return precedence(self) < precedence(str(other))

    def __ge__(self, other: object) -> bool:
        return precedence(self) <= precedence(str(other))

    def __lt__(self, other: object) -> bool:
        return precedence(self) > precedence(str(other))

    def __le__(self, other: object) -> bool:
        return precedence(self) >= precedence(str(other))


class Status:
    """The ``status`` column of a task row."""

    PENDING = "PENDING"
    #: Due, but held back by a concurrency limit until a running task of its key finishes.
    BLOCKED = "BLOCKED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    DEAD = "DEAD"

    TERMINAL = frozenset({COMPLETED, FAILED, CANCELLED, DEAD})


def celery_state(status: str | None, retries: int = 0) -> str:
    """The Celery state a row's status shows as (PENDING for an unknown task, as in Celery)."""
    if status is None or status == Status.PENDING or status == Status.BLOCKED:
        return RETRY if status is not None and retries > 0 else PENDING
    return {
        Status.RUNNING: STARTED,
        Status.COMPLETED: SUCCESS,
        Status.FAILED: FAILURE,
        Status.DEAD: FAILURE,
        Status.CANCELLED: REVOKED,
    }[status]
