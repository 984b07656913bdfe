"""Connection pools that hand out the most recently returned connection first.

psycopg_pool takes connections from the front of its queue and returns them to the back, so a
pool that has grown to two connections (one startup request that waited is enough) serves a
single thread from both in turn. On a loop of one-row statements such as ``delay()`` that cost
a measurable part of every call: the backend and the client's objects of the connection that
sat idle are cold. Serving the last returned connection first (as SQLAlchemy's
``pool_use_lifo``) keeps one connection warm for a single caller and lets the ones no longer
needed stay idle, so that the pool's ``max_idle`` can close them.

Only the choice of connection changes: the pool still owns the queue, its lock, its waiting
clients and its statistics. The queue is rotated under the pool's lock (the method below is
called with it held), so the rest keeps its order and ``max_idle`` still closes the connection
that has waited longest.
"""

from __future__ import annotations

from typing import Any

from psycopg_pool import AsyncConnectionPool, ConnectionPool


class LifoConnectionPool(ConnectionPool[Any]):
    """A ``ConnectionPool`` whose ``getconn`` returns the connection returned last."""

    def _get_ready_connection(self, timeout: float | None) -> Any:
        if len(self._pool) > 1:
            self._pool.rotate(1)
        return super()._get_ready_connection(timeout)


class AsyncLifoConnectionPool(AsyncConnectionPool[Any]):
    """An ``AsyncConnectionPool`` whose ``getconn`` returns the connection returned last."""

    async def _get_ready_connection(self, timeout: float | None) -> Any:
        if len(self._pool) > 1:
            self._pool.rotate(1)
        return await super()._get_ready_connection(timeout)
