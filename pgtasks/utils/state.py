"""Which task the current thread is running, for loggers and code that asks
(Celery's ``celery._state.get_current_task``).

The worker pushes a task before it runs a call and pops it after, in the thread (or prefork
child) that runs it; threads of a thread pool each see their own task.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = ["get_current_task", "pop_task", "push_task"]

_local = threading.local()


def push_task(task: Task[Any, Any]) -> None:
    """Mark ``task`` as running in this thread (nested calls stack)."""
    stack: list[Task[Any, Any]] = _local.__dict__.setdefault("stack", [])
    stack.append(task)


def pop_task() -> None:
    """Undo the matching :func:`push_task`."""
    stack: list[Task[Any, Any]] = _local.__dict__.get("stack", [])
    if stack:
        stack.pop()


def get_current_task() -> Task[Any, Any] | None:
    """The task this thread is running, or None outside a task."""
    stack: list[Task[Any, Any]] = _local.__dict__.get("stack", [])
    return stack[-1] if stack else None
