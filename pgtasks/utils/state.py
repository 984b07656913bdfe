"""Which task the current thread is running, for loggers and code that asks
(Celery's ``celery._state.get_current_task``).

The worker pushes a task before it runs a call and pops it after, in the thread (or prefork
child) that runs it; threads of a thread pool each see their own task.
"""

from __future__ import annotations

import contextvars
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pgtasks.task import Task

__all__ = ["get_current_task", "pop_task", "push_task"]

_stack: contextvars.ContextVar[tuple[Task[Any, Any], ...]] = contextvars.ContextVar(
    "pgtasks_current_task", default=()
)


def push_task(task: Task[Any, Any]) -> None:
    """Mark ``task`` as running in this thread or coroutine (nested calls stack)."""
    _stack.set((*_stack.get(), task))


def pop_task() -> None:
    """Undo the matching :func:`push_task`."""
    stack = _stack.get()
    if stack:
        _stack.set(stack[:-1])


def get_current_task() -> Task[Any, Any] | None:
    """The task this thread or coroutine is running, or None outside a task."""
    stack = _stack.get()
    return stack[-1] if stack else None
