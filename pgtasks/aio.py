"""The producer's side for asyncio applications: enqueue and wait for results without blocking
the event loop, on psycopg's async connections.

``await task.delay_async(...)``, ``await task.apply_async_async(...)`` and
``await result.get_async(timeout=)`` use one ``AsyncConnectionPool`` per app and event loop,
opened on first use (a pool belongs to the loop it was opened on). The statements are the
sync broker's own (``pgtasks/sql/queries.sql``), so rows, unique keys and errors are the same.
"""

from __future__ import annotations

import asyncio
import contextlib
import weakref
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import sql
from psycopg.rows import dict_row, tuple_row
from psycopg_pool import AsyncConnectionPool

from pgtasks.broker import (
    NO_HANDOFF,
    Broker,
    Row,
    _storage_errors,
    direct_gen,
    direct_rows,
    direct_state,
    result_channel,
)
from pgtasks.pools import AsyncLifoConnectionPool

if TYPE_CHECKING:
    from pgtasks.message import TaskMessage


class AsyncBroker:
    """The statements a producer needs, on an async pool of the loop that awaits them."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        # A pool is bound to the loop it was opened on; a closed loop drops its entry.
        self._pools: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncConnectionPool] = (
            weakref.WeakKeyDictionary()
        )
        self._listeners: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, ResultListener] = (
            weakref.WeakKeyDictionary()
        )

    async def pool(self) -> AsyncConnectionPool:
        loop = asyncio.get_running_loop()
        pool = self._pools.get(loop)
        if pool is None:
            b = self.broker
            pool = AsyncLifoConnectionPool(
                b.dsn,
                min_size=1,
                max_size=b.max_size,
                kwargs=b._conn_kwargs(),
                open=False,
                name="pgtasks-async",
            )
            self._pools[loop] = pool
            await pool.open(wait=False)
        return pool

    async def close(self) -> None:
        """Close the pool and the result listener of the running loop (if it has them)."""
        loop = asyncio.get_running_loop()
        listener = self._listeners.pop(loop, None)
        if listener is not None:
            await listener.close()
        pool = self._pools.pop(loop, None)
        if pool is not None:
            await pool.close()

    #: Seconds between attempts to listen again after the listening connection failed.
    LISTEN_RETRY = 5.0

    async def result_event(self) -> asyncio.Event | None:
        """The event the next stored result sets (the results NOTIFY, one listening connection
        per event loop); None when none could be had (the caller then polls). Take it before
        reading a result, so that a result stored in between still wakes the wait."""
        loop = asyncio.get_running_loop()
        listener = self._listeners.get(loop)
        if listener is not None and listener.failed:
            if loop.time() - listener.failed_at < self.LISTEN_RETRY:
                return None
            listener = None
        if listener is None:
            listener = self._listeners[loop] = ResultListener(self.broker)
        if not await listener.ready():
            return None
        return listener.event

    async def _all(
        self,
        name: str,
        params: dict[str, Any],
        conn: psycopg.AsyncConnection[Any] | None = None,
        row_factory: Any = dict_row,
    ) -> list[Any]:
        query = self.broker.q[name]
        if conn is not None:
            async with conn.cursor(row_factory=row_factory) as cur:
                await cur.execute(query, params)
                return await cur.fetchall() if cur.description else []
        pool = await self.pool()
        async with (
            pool.connection(timeout=self.broker.connect_timeout) as c,
            c.cursor(row_factory=row_factory) as cur,
        ):
            await cur.execute(query, params)
            return await cur.fetchall() if cur.description else []

    async def _direct(self, name: str, params: dict[str, Any]) -> list[Any]:
        """``Broker._direct`` on the loop's pool: a single enqueue's prepared statement sent
        through libpq, not a cursor."""
        statement = self.broker.direct_statement(name)
        assert statement is not None
        pool = await self.pool()
        async with pool.connection(timeout=self.broker.connect_timeout) as c:
            state = direct_state(c)
            async with c.lock:
                results = await c.wait(direct_gen(c.pgconn, statement, params, state))
        return direct_rows(results, state.encoding)

    async def enqueue(
        self, msg: TaskMessage, conn: psycopg.AsyncConnection[Any] | None = None
    ) -> str:
        """``Broker.enqueue`` without blocking the loop: the id of the task holding the call."""
        broker = self.broker
        with _storage_errors(msg.id):
            if msg.unique is None:
                name = broker.insert_statement(msg, conn is not None)
                params = broker._params(msg)
                if name == "insert_task_handoff":
                    early = broker.early_ok
                    if early is None:
                        asked = await self._all("early_commit_allowed", {}, None, tuple_row)
                        early = broker.note_early_commits(asked)
                    params["early"] = early
                direct = conn is None and broker.direct_statement(name) is not None
                try:
                    if direct:
                        found = await self._direct(name, params)
                    else:
                        found = await self._all(name, params, conn, tuple_row)
                except NO_HANDOFF:
                    if name == "insert_task":
                        raise
                    if direct:
                        await self._direct("insert_task", params)
                    else:
                        await self._all("insert_task", params, conn)
                    broker.handoff_missing()
                else:
                    if broker.committed_early(name, params, found):
                        await self._all("flush_commit", {}, None, tuple_row)
                return msg.id
            name, params, tries = broker.unique_plan(msg)
            for _ in range(tries):
                found = await self._all(name, params, conn, tuple_row)
                if found:
                    return str(found[0][0])
        return broker.unique_unsettled(msg, name)

    async def get_result(self, task_id: str) -> Row | None:
        found = await self._all("get_result", {"id": task_id})
        row: Row | None = found[0] if found else None
        if row is None or (row["status"] is None and row["state"] is None):
            return None
        return row


class ResultListener:
    """One LISTEN connection per event loop for ``get_async``: each stored result sets the
    current event and starts a new one, waking every waiter to read its own row. Only a hint:
    when the connection fails, waiters poll."""

    def __init__(self, broker: Broker) -> None:
        self.broker = broker
        self.event = asyncio.Event()
        self.failed = False
        self.failed_at = 0.0
        self._conn: psycopg.AsyncConnection[Any] | None = None
        self._task: asyncio.Task[None] | None = None
        self._started: asyncio.Future[bool] | None = None

    async def ready(self) -> bool:
        """Listening (started on first use); False if the connection could not be had."""
        if self._started is None:
            self._started = asyncio.get_running_loop().create_future()
            self._task = asyncio.create_task(self._listen())
        return await asyncio.shield(self._started)

    async def _listen(self) -> None:
        assert self._started is not None
        try:
            b = self.broker
            self._conn = await psycopg.AsyncConnection.connect(
                b.dsn, autocommit=True, connect_timeout=max(1, int(b.connect_timeout))
            )
            channel = sql.Identifier(result_channel(b.schema))
            await self._conn.execute(sql.SQL("LISTEN {}").format(channel))
        except (psycopg.Error, OSError):
            self._fail()
            self._started.set_result(False)
            return
        self._started.set_result(True)
        try:
            async for _ in self._conn.notifies():
                self.event.set()
                self.event = asyncio.Event()
        except (psycopg.Error, OSError):
            self._fail()
            self.event.set()  # waiters re-read now, then poll

    def _fail(self) -> None:
        self.failed = True
        self.failed_at = asyncio.get_running_loop().time()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, psycopg.Error, OSError):
                await self._task
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error, OSError):
                await self._conn.close()
