"""Loggers for task code (Celery's ``celery.utils.log``).

>>> from pgtasks.utils.log import get_task_logger
>>> logger = get_task_logger(__name__)

``get_task_logger`` returns a standard ``logging.Logger`` whose records carry ``task_id`` and
``task_name`` of the task running in the current thread (``'???'`` outside a task, as Celery's
task formatter writes), so a format string may use ``%(task_id)s`` and ``%(task_name)s``.
"""

from __future__ import annotations

import logging

from pgtasks.utils.state import get_current_task

__all__ = ["base_logger", "get_logger", "get_task_logger", "task_logger"]

RESERVED_LOGGER_NAMES = frozenset({"pgtasks", "pgtasks.task", "celery", "celery.task"})

#: The parent of pgtasks' own loggers.
base_logger = logging.getLogger("pgtasks")
#: The parent of every logger ``get_task_logger`` returns.
task_logger = logging.getLogger("pgtasks.task")


class TaskContextFilter(logging.Filter):
    """Adds ``task_id`` and ``task_name`` of the running task to each record."""

    def filter(self, record: logging.LogRecord) -> bool:
        task = get_current_task()
        request = task.request if task is not None else None
        if task is not None and request is not None and request.id is not None:
            record.__dict__.update(task_id=request.id, task_name=task.name)
        else:
            record.__dict__.setdefault("task_id", "???")
            record.__dict__.setdefault("task_name", "???")
        return True


_task_filter = TaskContextFilter()


def get_logger(name: str) -> logging.Logger:
    """The standard logger called ``name`` (Celery's ``get_logger``)."""
    return logging.getLogger(name)


def get_task_logger(name: str) -> logging.Logger:
    """A logger for task modules: its records carry the running task's id and name.

    Its parent is the ``pgtasks.task`` logger unless it already has handlers of its own, as in
    Celery; the names ``celery``, ``celery.task``, ``pgtasks`` and ``pgtasks.task`` are
    reserved.
    """
    if name in RESERVED_LOGGER_NAMES:
        raise RuntimeError(f"Logger name {name!r} is reserved!")
    logger = logging.getLogger(name)
    if not logger.handlers:
        logger.parent = task_logger
    if _task_filter not in logger.filters:
        logger.addFilter(_task_filter)
    return logger
