"""Sending the task signals from where a task runs, with Celery's senders and arguments.

Each function returns at once when nothing is connected, so an app without receivers pays
one attribute check per event.
"""

from __future__ import annotations

import contextlib
import traceback
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any, Protocol

from pgtasks import signals
from pgtasks.request import Request
from pgtasks.utils.state import pop_task, push_task

if TYPE_CHECKING:
    from types import TracebackType

    from pgtasks.app import Celery
    from pgtasks.message import ClaimedTask
    from pgtasks.task import Task


class Call(Protocol):
    """What the task signals need of a call: a worker's ``Job`` or an eager ``Request``."""

    @property
    def id(self) -> str | None: ...

    @property
    def args(self) -> tuple[Any, ...]: ...

    @property
    def kwargs(self) -> dict[str, Any]: ...


class ExceptionInfo:
    """An exception with its traceback, as Celery's ``einfo`` (billiard's ``ExceptionInfo``).

    ``str(einfo)`` and ``einfo.traceback`` are the formatted traceback.
    """

    def __init__(self, exc: BaseException) -> None:
        self.exception = exc
        self.type: type[BaseException] = type(exc)
        self.tb: TracebackType | None = exc.__traceback__
        self.traceback = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
        self.internal = False

    @property
    def exc_info(self) -> tuple[type[BaseException], BaseException, TracebackType | None]:
        """``(type, value, traceback)``, as ``sys.exc_info()`` gives."""
        return self.type, self.exception, self.tb

    def __str__(self) -> str:
        return self.traceback

    def __repr__(self) -> str:
        return f"<ExceptionInfo: {self.exception!r}>"


def prerun(task: Task[Any, Any], job: Call) -> None:
    """``task_prerun``: before the task body runs."""
    if signals.task_prerun.connected:
        signals.task_prerun.send(
            sender=task, task_id=job.id, task=task, args=job.args, kwargs=job.kwargs
        )


def postrun(
    task: Task[Any, Any], job: Call, state: str, retval: Any, request: Request | None = None
) -> None:
    """``task_postrun``: after the task ran, whatever the outcome. ``request`` is pushed again
    for receivers when the caller already popped it (they read ``sender.request``, as in
    Celery, where the request is popped only after this signal)."""
    if not signals.task_postrun.connected:
        return
    with _pushed(task, request):
        signals.task_postrun.send(
            sender=task,
            task_id=job.id,
            task=task,
            args=job.args,
            kwargs=job.kwargs,
            retval=retval,
            state=state,
        )


def success(task: Task[Any, Any], result: Any, request: Request | None = None) -> None:
    """``task_success``: the task returned ``result`` (``request`` as for :func:`postrun`)."""
    if not signals.task_success.connected:
        return
    with _pushed(task, request):
        signals.task_success.send(sender=task, result=result)


@contextlib.contextmanager
def _pushed(task: Task[Any, Any], request: Request | None) -> Iterator[None]:
    """``request`` as the task's current request for the block, unless it already is."""
    if request is None or task.request is request:
        yield
        return
    task.push_request(request)
    push_task(task)
    try:
        yield
    finally:
        pop_task()
        task.pop_request()


def failure(
    task: Task[Any, Any], job: Call, exc: BaseException, request: Request | None = None
) -> None:
    """``task_failure``: the task failed for good with ``exc`` (``request`` as for
    :func:`postrun`)."""
    if not signals.task_failure.connected:
        return
    with _pushed(task, request):
        signals.task_failure.send(
            sender=task,
            task_id=job.id,
            exception=exc,
            args=job.args,
            kwargs=job.kwargs,
            traceback=exc.__traceback__,
            einfo=ExceptionInfo(exc),
        )


def retry(
    task: Task[Any, Any], request: Request, reason: BaseException, cause: BaseException
) -> None:
    """``task_retry``: the task asked to run again; ``reason`` is the ``Retry`` exception."""
    if signals.task_retry.connected:
        signals.task_retry.send(
            sender=task, request=request, reason=reason, einfo=ExceptionInfo(cause)
        )


def revoked(
    app: Celery,
    row: ClaimedTask,
    hostname: str,
    *,
    expired: bool,
    signum: int | None = None,
) -> None:
    """``task_revoked`` from the worker's main process: the row expired before it ran, or was
    cancelled while it ran (``signum``: the signal its process was stopped with, for
    ``revoke(terminate=True)`` on the prefork pool)."""
    if not signals.task_revoked.connected:
        return
    request = Request(
        id=row.id,
        retries=row.retries,
        attempt=row.attempt,
        eta=row.run_at,
        expires=row.expires_at,
        hostname=hostname,
        delivery_info={"routing_key": row.queue, "queue": row.queue, "priority": row.priority},
        called_directly=False,
        parent_id=row.headers.get("parent_id"),
        root_id=row.headers.get("root_id") or row.id,
        group=row.headers.get("group"),
        headers=row.headers,
        max_retries=row.max_retries,
    )
    request.task = row.name  # type: ignore[attr-defined]
    signals.task_revoked.send(
        sender=app.tasks.get(row.name),
        request=request,
        terminated=signum is not None,
        signum=signum,
        expired=expired,
    )


def unknown(worker: Any, row: ClaimedTask) -> None:
    """``task_unknown``: the row names a task this worker has not registered."""
    if signals.task_unknown.connected:
        from pgtasks.exceptions import NotRegistered

        signals.task_unknown.send(
            sender=worker, name=row.name, id=row.id, message=row, exc=NotRegistered(row.name)
        )


def rejected(worker: Any, row: ClaimedTask, exc: BaseException) -> None:
    """``task_rejected``: the row cannot run at all (its payload does not decode)."""
    if signals.task_rejected.connected:
        from pgtasks.exceptions import InvalidTaskError

        error = InvalidTaskError(f"cannot decode payload of {row.name}[{row.id}]: {exc}")
        error.__cause__ = exc
        signals.task_rejected.send(sender=worker, message=row, exc=error)
