"""The producer's pools serve the connection returned last: one caller keeps one backend."""

from __future__ import annotations

import asyncio
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from pgtasks.pools import AsyncLifoConnectionPool, LifoConnectionPool
from tests.apps.harness import note_inserts, wait_until


@pytest.fixture
def backends(app: Celery, db: psycopg.Connection[Any]) -> Any:
    """Record the backend that inserts each task row; returns a reader of (id, pid) pairs."""
    read = note_inserts(db, app.broker.schema, "inserted_by", {"pid": ("int", "pg_backend_pid()")})
    return lambda: [(str(row["task_id"]), int(row["pid"])) for row in read()]


def test_one_thread_enqueues_on_the_connection_it_used_last(app: Celery, backends: Any) -> None:
    @app.task(name="pools.noop")
    def noop() -> None:
        return None

    pool = app.broker.pool
    assert isinstance(pool, LifoConnectionPool)
    # At least two connections in the pool.
    first = pool.getconn(timeout=10.0)
    second = pool.getconn(timeout=10.0)
    pool.putconn(first)
    pool.putconn(second)
    # A growth the getconns started may still be opening a connection, which joins the pool
    # when it is ready: wait for it, so that the one returned last below stays on top.
    wait_until(
        lambda: pool.get_stats()["pool_available"] == pool.get_stats()["pool_size"],
        what="the pool to finish growing",
    )
    assert pool.get_stats()["pool_available"] >= 2
    # The one returned last on top.
    conn = pool.getconn(timeout=10.0)
    with conn.cursor() as cur:
        cur.execute("SELECT pg_backend_pid()")
        row = cur.fetchone()
        assert row is not None
        top = int(row[0])
    pool.putconn(conn)
    size = pool.get_stats()["pool_size"]

    ids = [noop.delay().id for _ in range(6)]

    seen = backends()
    assert [task_id for task_id, _ in seen] == ids
    # FIFO would have taken the other connection first and alternated from there.
    assert {pid for _, pid in seen} == {top}
    # And the enqueues opened no connection.
    assert pool.get_stats()["pool_size"] == size


def test_connections_held_at_once_are_still_distinct(app: Celery) -> None:
    pool = app.broker.pool
    held = [pool.getconn(timeout=10.0) for _ in range(3)]
    try:
        assert len({id(conn) for conn in held}) == 3
    finally:
        for conn in held:
            pool.putconn(conn)
    # Back in the order they were returned: the last one comes out first, then the one before.
    assert pool.getconn(timeout=10.0) is held[2]
    assert pool.getconn(timeout=10.0) is held[1]


def test_the_asyncio_producer_keeps_one_backend_too(app: Celery, backends: Any) -> None:
    @app.task(name="pools.noop_async")
    def noop() -> None:
        return None

    async def main() -> tuple[list[str], int]:
        try:
            pool = await app.async_broker.pool()
            assert isinstance(pool, AsyncLifoConnectionPool)
            await pool.wait(timeout=10.0)
            first = await pool.getconn(timeout=10.0)
            second = await pool.getconn(timeout=10.0)
            cur = await second.execute("SELECT pg_backend_pid()")
            row = await cur.fetchone()
            assert row is not None
            await pool.putconn(first)
            await pool.putconn(second)
            ids = [(await noop.delay_async()).id for _ in range(6)]
        finally:
            await app.close_async()
        return ids, int(row[0])

    ids, top = asyncio.run(main())
    seen = backends()
    assert [task_id for task_id, _ in seen] == ids
    assert {pid for _, pid in seen} == {top}
