"""The producer's pools serve the connection returned last: one caller keeps one backend.
Single enqueues keep one connection out of the pool between calls."""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
from typing import Any

import psycopg
import pytest
from psycopg.conninfo import make_conninfo

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


def _backends_of(db: psycopg.Connection[Any], tag: str) -> set[int]:
    found = db.execute(
        "SELECT pid FROM pg_stat_activity WHERE application_name = %s", (tag,)
    ).fetchall()
    return {int(row[0]) for row in found}


def test_single_enqueues_keep_one_connection_and_close_hands_it_back(
    app: Celery, pg_dsn: str, db: psycopg.Connection[Any], backends: Any
) -> None:
    tag = f"pgtasks-test-{uuid.uuid4().hex[:10]}"
    app.conf.broker_url = make_conninfo(pg_dsn, application_name=tag)

    @app.task(name="pools.kept")
    def kept() -> None:
        return None

    ids = [kept.delay().id for _ in range(5)]
    seen = backends()
    assert [task_id for task_id, _ in seen] == ids
    assert len({pid for _, pid in seen}) == 1
    pool = app.broker.pool
    # Out of the pool while kept: a statement of another kind gets another connection.
    with pool.connection() as other:
        row = other.execute("SELECT pg_backend_pid()").fetchone()
        assert row is not None
        assert int(row[0]) != seen[0][1]
    app.close()
    wait_until(lambda: not _backends_of(db, tag), what="the app's connections to close")


def test_a_kept_connection_is_handed_back_after_its_time(
    app: Celery, backends: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    @app.task(name="pools.turn")
    def turn() -> None:
        return None

    broker = app.broker
    turn.delay()

    def requests() -> int:
        return int(broker.pool.get_stats().get("requests_num", 0))

    asked = requests()
    turn.delay()
    assert requests() == asked  # kept: the pool was not asked
    monkeypatch.setattr(broker, "HOT_FOR", 0.0)
    turn.delay()
    # Handed back to the pool and taken again from its top: the same connection, asked of
    # (and checked by) the pool once more.
    assert requests() == asked + 1
    pids = [pid for _, pid in backends()]
    assert len(pids) == 3 and len(set(pids)) == 1, pids


def test_threads_enqueueing_at_once_write_every_row_once(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="pools.many")
    def many(n: int) -> None:
        return None

    sent: list[str] = []
    lock = threading.Lock()

    def send(offset: int) -> None:
        for n in range(offset, offset + 50):
            task_id = many.delay(n).id
            with lock:
                sent.append(task_id)

    threads = [threading.Thread(target=send, args=(k * 50,)) for k in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    stored = db.execute("SELECT id FROM tasks WHERE name = 'pools.many'").fetchall()
    assert sorted(row[0] for row in stored) == sorted(sent)
    assert len(sent) == 200


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_enqueues_on_its_own_connection_and_leaves_the_parents(
    app: Celery, backends: Any
) -> None:
    @app.task(name="pools.forked")
    def forked() -> None:
        return None

    before = forked.delay().id
    pid = os.fork()
    if pid == 0:  # the child: enqueue, then leave without running any cleanup of the parent's
        code = 1
        try:
            forked.apply_async(task_id="from-the-child")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    after = forked.delay().id
    # The parent's connection still works, and is still the one it keeps; the child's is
    # another.
    by_id = dict(backends())
    assert set(by_id) == {before, "from-the-child", after}
    assert by_id[before] == by_id[after] != by_id["from-the-child"]
