"""Exceptions, under the names Celery users already catch."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from kombu.exceptions import DecodeError, EncodeError, OperationalError

__all__ = [
    "AlreadyRegistered",
    "AlwaysEagerIgnored",
    "BackendError",
    "BackendGetMetaError",
    "BackendStoreError",
    "CDeprecationWarning",
    "CPendingDeprecationWarning",
    "CeleryError",
    "CeleryWarning",
    "ChordError",
    "DecodeError",
    "DuplicateNodenameWarning",
    "DuplicateTaskNameWarning",
    "EncodeError",
    "FixupWarning",
    "Ignore",
    "ImproperlyConfigured",
    "IncompleteStream",
    "InvalidTaskError",
    "MaxRetriesExceededError",
    "NotConfigured",
    "NotPermitted",
    "NotRegistered",
    "OperationalError",
    "PgTasksError",
    "QueueNotFound",
    "QuotaExceeded",
    "Reject",
    "Retry",
    "RetryTaskError",
    "SchemaOutOfDate",
    "SecurityError",
    "SecurityWarning",
    "SoftTimeLimitExceeded",
    "SystemTerminate",
    "TaskError",
    "TaskPredicate",
    "TaskRevokedError",
    "Terminated",
    "TimeLimitExceeded",
    "TimeoutError",
    "WorkerLostError",
    "WorkerShutdown",
    "WorkerTerminate",
    "reraise",
]


class PgTasksError(Exception):
    """Base class of pgtasks' own errors."""


#: Celery's name for the base class, so ``except CeleryError`` keeps working.
CeleryError = PgTasksError


class TaskError(PgTasksError):
    """Base class of errors about one task or its call (Celery's ``TaskError``)."""


class TaskPredicate(PgTasksError):
    """Base class of the exceptions a task raises to steer the worker (Retry, Ignore, Reject)."""


class ImproperlyConfigured(PgTasksError):
    """A setting or the database URL is wrong; the message says what to change."""


class SchemaOutOfDate(PgTasksError):
    """The database schema is older or newer than this version of pgtasks."""


class NotRegistered(TaskError, KeyError):
    """No task of that name is registered with the app.

    Its text is the quoted task name, as in Celery (a ``KeyError``); the repr says more.
    """

    def __repr__(self) -> str:
        name = self.args[0] if self.args else "?"
        return f"Task of kind {name!r} never registered, please make sure it's imported."


class TimeoutError(TaskError):
    """``AsyncResult.get`` waited longer than its timeout."""


class TaskRevokedError(TaskError):
    """The task was revoked (cancelled) and will not produce a result."""


class WorkerLostError(PgTasksError):
    """The process running the task died."""


class MaxRetriesExceededError(TaskError):
    """``self.retry()`` was called after the task's max_retries were used up."""


class SoftTimeLimitExceeded(PgTasksError):
    """Raised inside a task when its soft time limit passes."""


class Terminated(PgTasksError):
    """The task was stopped by ``revoke(terminate=True)`` (Celery's, from billiard)."""


class TimeLimitExceeded(PgTasksError):
    """The task passed its hard time limit and its process was replaced."""

    def __str__(self) -> str:
        # Celery's (billiard's) text for this error, e.g. "TimeLimitExceeded(0.5,)".
        return f"TimeLimitExceeded{self.args!r}"


class Retry(TaskPredicate):
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


class Ignore(TaskPredicate):
    """Raised by a task to tell the worker not to record any state for it."""


class Reject(TaskPredicate):
    """Raised by a task to reject its message; ``requeue=True`` puts it back in the queue."""

    def __init__(self, reason: Any = None, requeue: bool = False) -> None:
        self.reason = reason
        self.requeue = requeue
        super().__init__(reason, requeue)


#: Celery's old name for :class:`Retry`.
RetryTaskError = Retry


class SecurityError(PgTasksError):
    """A message failed a security check."""


class NotPermitted(SecurityError):
    """The database refused a statement to this client's role (see ``pgtasks grants``)."""


class QuotaExceeded(PgTasksError):
    """An enqueue would leave its source with more waiting tasks than its quota
    (``pgtasks quota``); nothing of it was written."""


class QueueNotFound(KeyError, TaskError):
    """A task was sent to a queue that ``task_queues`` does not define."""


class IncompleteStream(TaskError):
    """A stream of data ended before it was complete."""


class AlreadyRegistered(TaskError):
    """A task of that name is already registered."""


class InvalidTaskError(TaskError):
    """A task row or message is malformed (its payload is not ``[args, kwargs]``)."""


class ChordError(TaskError):
    """A member of a chord's header failed, so its body cannot run."""


class WorkerTerminate(SystemExit):
    """Raised to stop the worker at once (cold shutdown)."""


#: Celery's old name for :class:`WorkerTerminate`.
SystemTerminate = WorkerTerminate


class WorkerShutdown(SystemExit):
    """Raised to stop the worker after its running tasks finish (warm shutdown)."""


class BackendError(PgTasksError):
    """Reading or writing a result failed."""


class BackendGetMetaError(BackendError):
    """Reading a result failed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)
        self.task_id = kwargs.get("task_id", "")


class BackendStoreError(BackendError):
    """Writing a result failed."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args)
        self.state = kwargs.get("state", "")
        self.task_id = kwargs.get("task_id", "")


class CeleryWarning(UserWarning):
    """Base class of pgtasks' warnings (Celery's name)."""


class AlwaysEagerIgnored(CeleryWarning):
    """An option was ignored because tasks run eagerly."""


class DuplicateNodenameWarning(CeleryWarning):
    """Two workers share a name."""


class DuplicateTaskNameWarning(CeleryWarning):
    """Two tasks share a name."""


class FixupWarning(CeleryWarning):
    """A framework integration could not be set up."""


class NotConfigured(CeleryWarning):
    """The app is used before it is configured."""


class SecurityWarning(CeleryWarning):
    """A setting weakens security."""


class CPendingDeprecationWarning(PendingDeprecationWarning):
    """A feature will be deprecated."""


class CDeprecationWarning(DeprecationWarning):
    """A feature is deprecated."""


def reraise(tp: type[BaseException], value: BaseException, tb: Any = None) -> None:
    """Raise ``value`` again with traceback ``tb`` (Celery's helper)."""
    if value.__traceback__ is not tb:
        raise value.with_traceback(tb)
    raise value
