"""The immutable envelopes that travel between the API, the broker and the worker.

``TaskMessage`` is one enqueued call as its row will hold it; ``ClaimedTask`` is a row a worker
has claimed. Header names follow Celery's message protocol v2 where Celery has one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pgtasks.serialization import Encoded


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(unsafe_hash=True)
class TaskMessage:
    """One call of a task, ready to be written as a row."""

    id: str
    name: str
    queue: str
    priority: int
    body: Encoded
    headers: dict[str, Any] = field(default_factory=dict)
    eta: datetime | None = None
    countdown: float | None = None
    expires_at: datetime | None = None
    expires_in: float | None = None
    max_retries: int | None = None
    #: A unique call's key and how long it is held (see pgtasks.unique); None: not unique.
    unique: Unique | None = None

    @property
    def unique_key(self) -> str | None:
        return self.unique.key if self.unique is not None else None


@dataclass(frozen=True)
class Unique:
    """A unique call's key, held for ``window`` seconds from the first enqueue, else by the
    task's status: while it waits or runs, or (``until_started``) until first claimed."""

    key: str
    window: float | None = None
    until_started: bool = False


# Not frozen: a frozen dataclass's __init__ costs about a microsecond more (one
# object.__setattr__ per field), once or more per task. Treat it as immutable.
@dataclass(slots=True, unsafe_hash=True)
class ClaimedTask:
    """A row this worker owns until its lease runs out: ``(id, attempt)`` is the fencing token."""

    id: str
    name: str
    queue: str
    priority: int
    attempt: int
    retries: int
    max_retries: int | None
    content_type: str
    content_encoding: str
    payload: str | None
    payload_raw: bytes | None
    headers: dict[str, Any]
    run_at: datetime
    expires_at: datetime | None
    expired: bool
    created_at: datetime
    #: The attempt a dead-letter requeue started from (0 if never requeued): workers lost
    #: before it do not count against the task's budget any more.
    requeued_attempt: int = 0
    #: Not claimed, never run: set BLOCKED by the claim (its concurrency limit is full), or
    #: left PENDING until its rate-limit start time. None for a claimed row.
    set_aside: str | None = None

    @property
    def body(self) -> bytes | str:
        """The serialized ``[args, kwargs]`` whichever column holds it."""
        if self.payload is not None:
            return self.payload
        return self.payload_raw or b""
