"""The worker's log of a claimed row: bound to the row on first use, and quiet at levels the
worker's logger does not emit, so that a run that logs nothing costs nothing."""

from __future__ import annotations

import logging
from typing import Any

from pgtasks.message import ClaimedTask


def log_enabled(log: Any, level: int) -> bool:
    """Whether ``log`` emits at ``level`` (a logger that cannot tell is taken to emit)."""
    check = getattr(log, "is_enabled_for", None)
    return check is None or bool(check(level))


class TaskLog:
    """A claimed row's logger, bound to its task id, name, queue and attempt on first use:
    most runs emit nothing at the worker's level, and binding per row would cost more than
    running a short task. ``levels`` are the worker's (see Worker._levels), read once."""

    __slots__ = ("_bound", "_levels", "_log", "_row")

    def __init__(self, log: Any, row: ClaimedTask, levels: tuple[bool, bool]) -> None:
        self._log = log
        self._row = row
        self._bound: Any = None
        self._levels = levels

    def _enabled(self, level: int) -> bool:
        return self._levels[0] if level == logging.DEBUG else self._levels[1]

    def _logger(self) -> Any:
        if self._bound is None:
            row = self._row
            self._bound = self._log.bind(
                task_id=row.id,
                task_name=row.name,
                queue=row.queue,
                attempt=row.attempt,
                retries=row.retries,
            )
        return self._bound

    def debug(self, event: str, **kw: Any) -> None:
        if self._enabled(logging.DEBUG):
            self._logger().debug(event, **kw)

    def info(self, event: str, **kw: Any) -> None:
        if self._enabled(logging.INFO):
            self._logger().info(event, **kw)

    def warning(self, event: str, **kw: Any) -> None:
        self._logger().warning(event, **kw)

    def error(self, event: str, **kw: Any) -> None:
        self._logger().error(event, **kw)
