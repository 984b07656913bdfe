"""AsyncResult: a task's state and return value, read from Postgres."""

from __future__ import annotations

import builtins
import sys
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgtasks import states
from pgtasks.exceptions import TaskRevokedError, TimeoutError

if TYPE_CHECKING:
    from pgtasks.app import Celery


def exception_to_dict(exc: BaseException) -> dict[str, Any]:
    """Celery's serialized form of an exception (what a result backend stores)."""
    return {
        "exc_type": type(exc).__name__,
        "exc_message": list(_plain_args(exc.args)),
        "exc_module": type(exc).__module__,
    }


def _plain_args(args: tuple[Any, ...]) -> list[Any]:
    return [a if isinstance(a, (str, int, float, bool, type(None))) else repr(a) for a in args]


def exception_from_dict(data: Any) -> BaseException:
    """Rebuild an exception from its stored form without importing anything new.

    The class is reused only when its module is already imported and the name is an exception
    class there; otherwise a stand-in class of the same name is made.
    """
    if not isinstance(data, dict) or "exc_type" not in data:
        return Exception(data)
    name = str(data.get("exc_type"))
    module = str(data.get("exc_module") or "builtins")
    message = data.get("exc_message") or []
    if not isinstance(message, (list, tuple)):
        message = [message]
    source = builtins if module == "builtins" else sys.modules.get(module)
    found = getattr(source, name, None) if source is not None else None
    cls: type[BaseException]
    if isinstance(found, type) and issubclass(found, BaseException):
        cls = found
    else:
        cls = type(name, (Exception,), {"__module__": module})
    try:
        rebuilt: BaseException = cls(*message)
        return rebuilt
    except Exception:
        fallback: type[BaseException] = type(name, (Exception,), {"__module__": module})
        return fallback(*message)


class AsyncResult:
    """The result of one task call, fetched from the database when asked."""

    def __init__(self, id: str, app: Celery, task_name: str | None = None) -> None:
        self.id = id
        self.task_id = id
        self.app = app
        self.name = task_name
        self._cache: dict[str, Any] | None = None

    def __repr__(self) -> str:
        return f"<AsyncResult: {self.id}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, AsyncResult):
            return other.id == self.id
        if isinstance(other, str):
            return other == self.id
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    def _meta(self) -> dict[str, Any]:
        if self._cache is not None:
            return self._cache
        row = self.app.broker.get_result(self.id)
        meta: dict[str, Any] = {
            "state": states.PENDING,
            "result": None,
            "traceback": None,
            "date_done": None,
        }
        if row is not None:
            state = row["state"] or states.celery_state(row["status"], row["retries"] or 0)
            meta["state"] = state
            meta["traceback"] = row["traceback"] or row["task_traceback"]
            meta["date_done"] = row["date_done"]
            if row["result"] is not None:
                value = self.app.decode_result(
                    bytes(row["result"]), row["content_type"], row["content_encoding"]
                )
                meta["result"] = (
                    exception_from_dict(value) if state in states.EXCEPTION_STATES else value
                )
            elif state in states.EXCEPTION_STATES:
                error = row["error"] or state
                meta["result"] = (
                    TaskRevokedError(error) if state == states.REVOKED else Exception(error)
                )
        if meta["state"] in states.READY_STATES:
            self._cache = meta
        return meta

    @property
    def state(self) -> str:
        """Celery's state name: PENDING, STARTED, RETRY, SUCCESS, FAILURE or REVOKED."""
        return str(self._meta()["state"])

    status = state

    @property
    def result(self) -> Any:
        """The return value, or the exception for a failed task."""
        return self._meta()["result"]

    info = result

    @property
    def traceback(self) -> str | None:
        return self._meta()["traceback"]  # type: ignore[no-any-return]

    @property
    def date_done(self) -> datetime | None:
        return self._meta()["date_done"]  # type: ignore[no-any-return]

    def ready(self) -> bool:
        return self.state in states.READY_STATES

    def successful(self) -> bool:
        return self.state == states.SUCCESS

    def failed(self) -> bool:
        return self.state == states.FAILURE

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.05,
        disable_sync_subtasks: bool = True,
    ) -> Any:
        """Wait until the task is ready; return its value or raise its exception."""
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = min(interval, 0.01)
        while True:
            meta = self._meta()
            if meta["state"] in states.READY_STATES:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(
                    f"task {self.id} not ready after {timeout}s (state {meta['state']})"
                )
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            time.sleep(pause)
            wait = min(wait * 1.5, max(interval, 0.01))
        if propagate and meta["state"] in states.PROPAGATE_STATES:
            exc = meta["result"]
            if isinstance(exc, BaseException):
                raise exc
            raise Exception(exc)
        return meta["result"]

    wait = get

    def revoke(self, terminate: bool = False, signal: str | None = None) -> None:
        """Cancel: a waiting task never runs; a running one cannot record success."""
        self.app.control.revoke(self.id, terminate=terminate, signal=signal)
        self._cache = None

    def forget(self) -> None:
        """Drop the stored result."""
        self.app.broker.forget(self.id)
        self._cache = None


class EagerResult(AsyncResult):
    """The result of a call run in-process (``apply`` or ``task_always_eager``)."""

    def __init__(self, id: str, value: Any, state: str, task_name: str | None = None) -> None:
        self.id = id
        self.task_id = id
        self.name = task_name
        self._value = value
        self._state = state
        self._cache = None

    def _meta(self) -> dict[str, Any]:
        return {"state": self._state, "result": self._value, "traceback": None, "date_done": None}

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.05,
        disable_sync_subtasks: bool = True,
    ) -> Any:
        if (
            propagate
            and self._state in states.PROPAGATE_STATES
            and isinstance(self._value, BaseException)
        ):
            raise self._value
        return self._value

    def revoke(self, terminate: bool = False, signal: str | None = None) -> None:
        """An eager task already ran; nothing to revoke."""

    def forget(self) -> None:
        """Nothing is stored for an eager task."""
