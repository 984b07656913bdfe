"""Exceptions, under the names Celery users already catch."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kombu.exceptions import DecodeError, EncodeError

__all__ = [
    "DecodeError",
    "EncodeError",
    "Ignore",
    "ImproperlyConfigured",
    "MaxRetriesExceededError",
    "NotRegistered",
    "PgTasksError",
    "Reject",
    "Retry",
    "SchemaOutOfDate",
    "SoftTimeLimitExceeded",
    "TaskRevokedError",
    "TimeLimitExceeded",
    "TimeoutError",
    "WorkerLostError",
]


class PgTasksError(Exception):
    """Base class of pgtasks' own errors."""


class ImproperlyConfigured(PgTasksError):
    """A setting or the database URL is wrong; the message says what to change."""


class SchemaOutOfDate(PgTasksError):
    """The database schema is older or newer than this version of pgtasks."""


class NotRegistered(PgTasksError, KeyError):
    """No task of that name is registered with the app."""

    def __str__(self) -> str:
        return f"task {self.args[0]!r} is not registered" if self.args else "task not registered"


class TimeoutError(PgTasksError):
    """``AsyncResult.get`` waited longer than its timeout."""


class TaskRevokedError(PgTasksError):
    """The task was revoked (cancelled) and will not produce a result."""


class WorkerLostError(PgTasksError):
    """The process running the task died."""


class MaxRetriesExceededError(PgTasksError):
    """``self.retry()`` was called after the task's max_retries were used up."""


class SoftTimeLimitExceeded(PgTasksError):
    """Raised inside a task when its soft time limit passes."""


class TimeLimitExceeded(PgTasksError):
    """The task passed its hard time limit and its process was replaced."""


class Retry(PgTasksError):
    """Raised by ``Task.retry`` to ask the worker for a durable retry."""

    def __init__(
        self,
        message: str | None = None,
        exc: BaseException | None = None,
        when: float | datetime | None = None,
        **kwargs: Any,
    ) -> None:
        self.message = message
        self.exc = exc
        self.when = when
        super().__init__(message or (repr(exc) if exc is not None else "Retry"))

    def humanize(self) -> str:
        if isinstance(self.when, datetime):
            return f"at {self.when.isoformat()}"
        return f"in {self.when}s"

    def __reduce__(self) -> tuple[Any, ...]:
        return (self.__class__, (self.message, self.exc, self.when))


class Ignore(PgTasksError):
    """Raised by a task to tell the worker not to record any state for it."""


class Reject(PgTasksError):
    """Raised by a task to reject its message; ``requeue=True`` puts it back in the queue."""

    def __init__(self, reason: Any = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = requeue
        super().__init__(reason, requeue)
