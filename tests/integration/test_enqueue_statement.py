"""The single enqueue's statement as the pool sends it (through libpq, its parameters as text,
the raw payload as binary) writes the same row a cursor writes, and survives a session that
lost its prepared statements."""

from __future__ import annotations

import asyncio
import dataclasses
from datetime import datetime, timedelta, timezone
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps.harness import note_inserts, task_row


@pytest.fixture
def noop(app: Celery) -> Any:
    @app.task(name="enqueue.noop")
    def noop() -> None:
        pass

    return noop


#: Every column a producer decides (not the times the server stamps, nor the id).
COLUMNS = (
    "name",
    "queue",
    "priority",
    "run_at",
    "expires_at",
    "content_type",
    "content_encoding",
    "payload",
    "payload_raw",
    "headers",
    "max_retries",
    "status",
    "attempt",
)


def written(db: psycopg.Connection[Any], task_id: str) -> dict[str, Any]:
    row = task_row(db, task_id)
    return {c: row[c] for c in COLUMNS}


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_the_pool_writes_the_row_a_cursor_writes(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, serializer: str
) -> None:
    app.conf.update(accept_content=["json", "pickle"])

    @app.task(name="enqueue.every_field", queue="wide", priority=-3, max_retries=7)
    def every_field(*args: Any, **kwargs: Any) -> None:
        pass

    eta = datetime(2031, 5, 17, 3, 4, 5, 123456, tzinfo=timezone(timedelta(hours=5, minutes=30)))
    args: tuple[Any, ...] = ("héllo ☃", 2.5, -(2**40), None)
    if serializer == "pickle":
        # Bytes a text parameter could not carry: NUL, a backslash, invalid UTF-8.
        args += (b"\x00\\x\xff\x00",)
    msg = every_field.build_message(
        args,
        {"k": [1, {"z": "\u2028"}]},
        eta=eta,
        expires=eta + timedelta(days=1),
        serializer=serializer,
        headers={"tenant": "ünï", "n": 3},
    )
    assert (msg.body.raw is not None) == (serializer == "pickle")
    pooled = app.broker.enqueue(msg)
    on_cursor = dataclasses.replace(msg, id=msg.id + "-cursor")
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        assert app.broker.enqueue(on_cursor, conn=conn) == on_cursor.id
    assert written(db, pooled) == written(db, on_cursor.id)
    row = written(db, pooled)
    assert (row["queue"], row["priority"], row["max_retries"]) == ("wide", -3, 7)
    assert row["run_at"] == eta
    assert row["headers"]["tenant"] == "ünï"


def test_relative_times_are_the_database_clocks(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    r = noop.apply_async(countdown=3600.5, expires=7200.25)
    row = task_row(db, r.id)
    now = db.execute("SELECT now()").fetchone()
    assert now is not None
    assert timedelta(seconds=3590) < row["run_at"] - now[0] <= timedelta(seconds=3600.5)
    assert row["expires_at"] - row["run_at"] == timedelta(seconds=7200.25 - 3600.5)


def prepared(conn: psycopg.Connection[Any]) -> list[str]:
    return [r[0] for r in conn.execute("SELECT name FROM pg_prepared_statements")]


def test_an_enqueue_prepares_its_statement_again_after_the_session_lost_it(
    app: Celery, db: psycopg.Connection[Any], noop: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    inserted = note_inserts(db, app.broker.schema, "by", {"pid": ("int", "pg_backend_pid()")})
    pool = app.broker.pool
    handed: list[psycopg.Connection[Any]] = []
    getconn = pool.getconn

    def spy(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = getconn(*args, **kwargs)
        handed.append(conn)
        return conn

    monkeypatch.setattr(pool, "getconn", spy)
    first = noop.delay()
    [pid] = [row["pid"] for row in inserted()]
    # Single enqueues keep the connection they used last: the one the statement is prepared on.
    conn = next(c for c in handed if c.info.backend_pid == pid)
    assert prepared(conn)
    conn.execute("DEALLOCATE ALL")
    second = noop.delay()
    # The same session, its statement prepared anew.
    assert [row["pid"] for row in inserted()] == [pid, pid]
    assert prepared(conn)
    assert task_row(db, first.id)["status"] == task_row(db, second.id)["status"] == "PENDING"


def test_a_duplicate_id_is_refused_with_the_cursors_error(app: Celery, noop: Any) -> None:
    noop.apply_async(task_id="twice")
    with pytest.raises(ValueError, match="'twice' already exists"):
        noop.apply_async(task_id="twice")


def test_the_async_pool_writes_the_row_a_cursor_writes_and_prepares_again(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str
) -> None:
    @app.task(name="enqueue.async_fields", queue="wide", priority=4)
    def async_fields(*args: Any, **kwargs: Any) -> None:
        pass

    eta = datetime(2031, 1, 2, 3, 4, 5, 6, tzinfo=timezone.utc)

    async def enqueue_twice() -> tuple[str, str]:
        first = await async_fields.apply_async_async(("☃", 1.5), {"k": None}, eta=eta)
        pool = await app.async_broker.pool()
        async with pool.connection() as conn:
            cur = await conn.execute("SELECT name FROM pg_prepared_statements")
            assert await cur.fetchall(), "no statement prepared"
            await conn.execute("DEALLOCATE ALL")
        second = await async_fields.apply_async_async(("☃", 1.5), {"k": None}, eta=eta)
        return first.id, second.id

    async def main() -> tuple[str, str]:
        try:
            return await enqueue_twice()
        finally:
            await app.close_async()

    first, second = asyncio.run(main())
    msg = async_fields.build_message(("☃", 1.5), {"k": None}, eta=eta)
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        app.broker.enqueue(msg, conn=conn)
    assert written(db, first) == written(db, second) == written(db, msg.id)
