"""Celery's ``celery.contrib.abortable``: tasks that stop early when asked to.

    from pgtasks.contrib.abortable import AbortableAsyncResult, AbortableTask

    @app.task(bind=True, base=AbortableTask)
    def crunch(self, rows):
        for row in rows:
            if self.is_aborted():
                return "stopped early"
            ...

    AbortableAsyncResult(task_id, app=app).abort()

``abort()`` is ``revoke()``: the row is flagged in the database, so the task learns of it
wherever it runs (any pool, any host), and it ends REVOKED, never SUCCESS, whatever it returns.
Plain tasks can read ``self.request.cancelled`` the same way.
"""

from __future__ import annotations

from typing import Any

from pgtasks.result import AsyncResult
from pgtasks.task import Task

__all__ = ["ABORTED", "AbortableAsyncResult", "AbortableTask"]

#: Celery's state name for an aborted task; pgtasks reports such a task as REVOKED once it ends.
ABORTED = "ABORTED"


class AbortableAsyncResult(AsyncResult):
    """An AsyncResult that can ask its task to stop."""

    def is_aborted(self) -> bool:
        """Whether ``abort()`` (or ``revoke()``) was called for this task."""
        return self.app.broker.cancel_requested(self.id)

    def abort(self) -> None:
        """Ask the task to stop: a waiting one never runs; a running one sees ``is_aborted()``."""
        self.revoke()


class AbortableTask(Task[Any, Any]):
    """A task that checks ``self.is_aborted()`` now and then and stops when it is true."""

    def is_aborted(self, **kwargs: Any) -> bool:
        """Whether this call (or ``task_id=``) was aborted; asked of the database at most twice
        a second for the running call."""
        task_id = kwargs.get("task_id")
        if task_id is None or task_id == self.request.id:
            return self.request.cancelled
        return self.app.broker.cancel_requested(task_id)

    def AsyncResult(self, task_id: str, **kwargs: Any) -> AbortableAsyncResult:
        return AbortableAsyncResult(task_id, app=self.app, task_name=self.name, **kwargs)
