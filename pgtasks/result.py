"""AsyncResult: a task's state and return value, read from Postgres."""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import os
import sys
import threading
import time
from datetime import datetime
from typing import TYPE_CHECKING, Any

from pgtasks import states
from pgtasks.exceptions import ImproperlyConfigured, TaskRevokedError, TimeoutError

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

    #: The result of the call before this one in a chain (set where it is known: canvas).
    parent: AsyncResult | GroupResult | None = None
    #: True for a call made with its result ignored: get() returns None without waiting.
    ignored: bool = False

    def __init__(self, id: str, app: Celery | None = None, task_name: str | None = None) -> None:
        if app is None:
            from pgtasks.app import get_current_app

            app = get_current_app()
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
        return self._meta_of(self.app.broker.get_result(self.id))

    def _meta_of(self, row: dict[str, Any] | None) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "state": states.PENDING,
            "result": None,
            "traceback": None,
            "date_done": None,
        }
        if row is not None and row["state"] is None and row["ignore_result"]:
            # Nothing is stored for a call whose result is ignored: Celery reads PENDING.
            row = None
        if row is not None:
            stored, status = row["state"], row["status"]
            state = stored or states.celery_state(status, row["retries"] or 0)
            if stored == states.IGNORED:
                # The task raised Ignore: as in Celery, no outcome is stored and the result
                # keeps showing it as started, never ready.
                state = states.STARTED
            elif stored == states.RETRY and status != states.Status.PENDING:
                # The retry has started running (or finished): the row is newer.
                state = states.celery_state(status, row["retries"] or 0)
            elif stored not in states.READY_STATES and status in states.Status.TERMINAL:
                # A state the task reported while running (update_state) gives way to the
                # outcome once the row is finished, even when no result was kept.
                state = states.celery_state(status, row["retries"] or 0)
            meta["state"] = state
            meta["traceback"] = row["traceback"] or row["task_traceback"]
            meta["date_done"] = row["date_done"]
            stale = stored == states.RETRY and state != states.RETRY
            if row["result"] is not None and not stale:
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
        follow_parents: bool = True,
    ) -> Any:
        """Wait until the task is ready; return its value or raise its exception.

        As in Celery, a failed parent (an earlier chain step, a chord's header member) raises
        its own error here while this result is still waiting for it, and a call made with its
        result ignored returns None at once.
        """
        if self.ignored:
            return None
        deadline = None if timeout is None else time.monotonic() + timeout
        wait = min(interval, 0.01)
        while True:
            if propagate and follow_parents and self.parent is not None:
                self._maybe_reraise_parent_error()
            meta = self._meta()
            if meta["state"] in states.READY_STATES:
                break
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError("The operation timed out.")
            pause = wait if deadline is None else min(wait, max(0.0, deadline - time.monotonic()))
            # Woken by the results NOTIFY; the growing pause is only the fallback poll.
            listening = _result_waiter.wait(self.app, pause)
            wait = min(wait * 1.5, 1.0 if listening else max(interval, 0.01))
        if propagate and meta["state"] in states.PROPAGATE_STATES:
            if follow_parents and self.parent is not None:
                # A parent that failed meanwhile is the cause: its error wins, as in Celery.
                self._maybe_reraise_parent_error()
            exc = meta["result"]
            if isinstance(exc, BaseException):
                raise exc
            raise Exception(exc)
        return meta["result"]

    wait = get

    async def get_async(
        self, timeout: float | None = None, propagate: bool = True, interval: float = 0.05
    ) -> Any:
        """``get`` for asyncio code: waits without blocking the event loop, on psycopg's async
        connections, woken by the results NOTIFY (one listening connection per event loop; a
        growing pause is the fallback poll). Raises ``TimeoutError`` after ``timeout`` seconds."""
        if self.ignored:
            return None
        loop = asyncio.get_running_loop()
        deadline = None if timeout is None else loop.time() + timeout
        pause = 0.01
        broker = self.app.async_broker
        while True:
            stored = await broker.result_event()
            meta = self._meta_of(await broker.get_result(self.id))
            if meta["state"] in states.READY_STATES:
                break
            if deadline is not None and loop.time() >= deadline:
                raise TimeoutError("The operation timed out.")
            wait = pause if deadline is None else min(pause, max(0.0, deadline - loop.time()))
            if stored is None:
                await asyncio.sleep(wait)
            else:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stored.wait(), timeout=wait)
            # Listening, a stored result wakes the wait: the pause only bounds a missed one.
            pause = 1.0 if stored is not None else min(pause * 1.5, max(interval, 0.5))
        if propagate and meta["state"] in states.PROPAGATE_STATES:
            exc = meta["result"]
            if isinstance(exc, BaseException):
                raise exc
            raise Exception(exc)
        return meta["result"]

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> None:
        """Raise this task's exception if it failed (or was revoked)."""
        meta = self._meta()
        if propagate and meta["state"] in states.PROPAGATE_STATES:
            exc = meta["result"]
            raise exc if isinstance(exc, BaseException) else Exception(exc)

    def _maybe_reraise_parent_error(self) -> None:
        parents = []
        node = self.parent
        while node is not None:
            parents.append(node)
            node = node.parent
        for node in reversed(parents):
            node.maybe_throw()

    @property
    def children(self) -> list[AsyncResult]:
        """The calls this task's completion enqueued (link callbacks, the next chain step)."""
        return [
            AsyncResult(row["id"], self.app, task_name=row["name"])
            for row in self.app.broker.children(self.id)
        ]

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
        follow_parents: bool = True,
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


class _Listening:
    """A thread's LISTEN connection; closed when the thread's state is dropped at its end."""

    def __init__(self, key: tuple[int, str, str], conn: Any) -> None:
        self.key = key
        self.conn = conn

    def close(self) -> None:
        """Close the connection (a fork's inherited one is left to its owner)."""
        if self.key[0] == os.getpid():
            # Closing a broken connection must not raise into get().
            with contextlib.suppress(Exception):
                self.conn.close()

    def __del__(self) -> None:
        self.close()


class _ResultWaiter(threading.local):
    """One LISTEN connection per thread for ``AsyncResult.get``: a stored result wakes the
    waiter at once. Only a hint: any failure falls back to sleeping (polling)."""

    def __init__(self) -> None:
        self.listening: _Listening | None = None

    def wait(self, app: Celery, seconds: float) -> bool:
        """Wait up to ``seconds`` or until a result is stored; False when not listening."""
        import psycopg

        try:
            broker = app.broker
            key = (os.getpid(), broker.dsn, broker.schema)
            current = self.listening
            if current is None or current.key != key or current.conn.closed:
                self.close()
                self.listening = _Listening(key, broker.result_listen_connection())
                # A result stored before LISTEN took effect sent no wake-up here: re-read now.
                return True
            for _ in current.conn.notifies(timeout=max(seconds, 0.0), stop_after=1):
                break
            return True
        except (psycopg.Error, OSError, ImproperlyConfigured):
            self.close()
            time.sleep(seconds)
            return False

    def close(self) -> None:
        """Drop this thread's listening connection."""
        current, self.listening = self.listening, None
        if current is not None:
            current.close()


_result_waiter = _ResultWaiter()


class ResultSet:
    """Several results handled together (Celery's ResultSet)."""

    def __init__(self, results: list[Any], app: Celery | None = None) -> None:
        self.results = list(results)
        self._app = app

    @property
    def app(self) -> Celery:
        """The app the results belong to."""
        if self._app is not None:
            return self._app
        for r in self.results:
            if getattr(r, "app", None) is not None:
                found: Celery = r.app
                return found
        from pgtasks.app import current_app

        return current_app()

    def __len__(self) -> int:
        return len(self.results)

    def __iter__(self) -> Any:
        return iter(self.results)

    def __getitem__(self, index: int) -> Any:
        return self.results[index]

    def add(self, result: Any) -> None:
        """Add a result to the set."""
        if result not in self.results:
            self.results.append(result)

    def completed_count(self) -> int:
        """How many members succeeded."""
        return sum(1 for r in self.results if r.successful())

    def ready(self) -> bool:
        """Whether every member has finished."""
        return all(r.ready() for r in self.results)

    def successful(self) -> bool:
        """Whether every member succeeded."""
        return all(r.successful() for r in self.results)

    def failed(self) -> bool:
        """Whether any member failed."""
        return any(r.failed() for r in self.results)

    def waiting(self) -> bool:
        """Whether any member has not finished."""
        return not self.ready()

    def join(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        callback: Any = None,
        disable_sync_subtasks: bool = True,
    ) -> list[Any]:
        """Every member's value, in order; ``timeout`` covers the whole wait."""
        deadline = None if timeout is None else time.monotonic() + timeout
        values = []
        for r in self.results:
            remaining = None if deadline is None else max(0.0, deadline - time.monotonic())
            if deadline is not None and remaining == 0.0 and not r.ready():
                raise TimeoutError(f"the join operation timed out after {timeout}s")
            value = r.get(timeout=remaining, propagate=propagate)
            if callback is not None:
                callback(r.id, value)
            else:
                values.append(value)
        return values

    def get(
        self,
        timeout: float | None = None,
        propagate: bool = True,
        interval: float = 0.5,
        callback: Any = None,
        disable_sync_subtasks: bool = True,
    ) -> list[Any]:
        """Same as ``join``."""
        return self.join(timeout, propagate, interval, callback, disable_sync_subtasks)

    join_native = join

    def maybe_throw(self, propagate: bool = True, callback: Any = None) -> None:
        """Raise the first failed member's exception."""
        for r in self.results:
            r.maybe_throw(propagate=propagate)

    def revoke(self, terminate: bool = False, signal: str | None = None) -> None:
        """Revoke every member."""
        for r in self.results:
            r.revoke(terminate=terminate, signal=signal)

    def forget(self) -> None:
        """Drop every member's stored result."""
        for r in self.results:
            r.forget()


class GroupResult(ResultSet):
    """The results of a group: an id and its members' results, in order (Celery's)."""

    def __init__(
        self,
        id: str | None = None,
        results: list[Any] | None = None,
        parent: Any = None,
        app: Celery | None = None,
    ) -> None:
        super().__init__(results or [], app=app)
        self.id = id
        self.parent = parent

    def __repr__(self) -> str:
        return f"<GroupResult: {self.id} [{', '.join(str(r.id) for r in self.results)}]>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, GroupResult):
            return other.id == self.id and other.results == self.results
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.id)

    @property
    def children(self) -> list[Any]:
        """The members' results."""
        return self.results

    def save(self, backend: Any = None) -> GroupResult:
        """Store the member ids under the group id, for ``GroupResult.restore``."""
        if self.id is None:
            raise ValueError("a GroupResult needs an id to be saved")
        self.app.broker.save_group(self.id, [str(r.id) for r in self.results])
        return self

    def delete(self, backend: Any = None) -> None:
        """Forget the saved group."""
        if self.id is not None:
            self.app.broker.delete_group(self.id)

    @classmethod
    def restore(cls, id: str, backend: Any = None, app: Celery | None = None) -> GroupResult | None:
        """The group saved under ``id``, or None."""
        if app is None:
            from pgtasks.app import current_app

            app = current_app()
        ids = app.broker.restore_group(id)
        if ids is None:
            return None
        return cls(id, [AsyncResult(i, app) for i in ids], app=app)
