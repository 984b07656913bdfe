"""``self.request``: what a running task knows about its own call."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any


@dataclass
class Request:
    """The execution context of one task call, under Celery's attribute names."""

    id: str | None = None
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    retries: int = 0
    attempt: int = 0
    eta: datetime | None = None
    expires: datetime | None = None
    hostname: str | None = None
    delivery_info: dict[str, Any] = field(default_factory=dict)
    is_eager: bool = False
    called_directly: bool = True
    parent_id: str | None = None
    root_id: str | None = None
    group: str | None = None
    headers: dict[str, Any] = field(default_factory=dict)
    max_retries: int | None = None
    # Set by Task.retry when the retry budget is spent, so the worker dead-letters the row.
    retries_exhausted: bool = False
    # Asks the database whether this call was revoked (set by the worker; see ``cancelled``).
    cancel_check: Callable[[], bool] | None = field(default=None, repr=False, compare=False)

    @property
    def cancelled(self) -> bool:
        """Whether this call was revoked while it runs (``revoke()``): a long task checks it now
        and then and stops early. Asked of the database at most twice a second."""
        return self.cancel_check is not None and self.cancel_check()

    @property
    def task_id(self) -> str | None:
        return self.id
