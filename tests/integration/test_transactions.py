"""Enqueue inside the caller's transaction: committed rows run, rolled-back rows never exist,
and no worker sees a row before its transaction commits."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from pgtasks.exceptions import ImproperlyConfigured


@pytest.fixture
def tx(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """A caller's own connection, not in autocommit mode (every statement opens a transaction)."""
    with psycopg.connect(pg_dsn) as conn:
        yield conn


@pytest.fixture
def add(app: Celery) -> Any:
    @app.task(name="tx.add")
    def add(x: int, y: int) -> int:
        return x + y

    return add


def count_rows(db: psycopg.Connection[Any], *ids: str) -> int:
    row = db.execute("SELECT count(*) FROM tasks WHERE id = ANY(%s)", [list(ids)]).fetchone()
    assert row is not None
    return int(row[0])


def test_given_an_open_transaction_when_it_commits_then_the_task_runs(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any], worker_factory
) -> None:
    with worker_factory():
        result = add.apply_async((2, 3), connection=tx)
        assert tx.info.transaction_status == psycopg.pq.TransactionStatus.INTRANS
        # Another session (the worker's view) does not see the row until the commit.
        assert count_rows(db, result.id) == 0
        marker = add.delay(0, 0)  # committed at once: once it ran, the worker has polled past
        assert marker.get(timeout=10) == 0
        assert count_rows(db, result.id) == 0
        tx.commit()
        assert result.get(timeout=10) == 5


def test_given_an_open_transaction_when_it_rolls_back_then_the_task_never_exists(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any], worker_factory
) -> None:
    with worker_factory():
        doomed = add.apply_async((1, 1), connection=tx)
        tx.rollback()
        marker = add.delay(0, 0)
        assert marker.get(timeout=10) == 0
    assert count_rows(db, doomed.id) == 0
    assert doomed.state == "PENDING"  # Celery's answer for an id it knows nothing of


def test_no_claim_sees_an_uncommitted_row(
    app: Celery, add: Any, tx: psycopg.Connection[Any]
) -> None:
    add.apply_async((1, 2), connection=tx)
    assert app.broker.claim("probe", ["celery"], 10, 5.0) == []
    tx.commit()
    claimed = app.broker.claim("probe", ["celery"], 10, 5.0)
    assert [c.name for c in claimed] == ["tx.add"]


def test_apply_many_on_a_connection_commits_and_rolls_back_with_it(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any], worker_factory
) -> None:
    rolled_back = add.apply_many([(1, 1), (2, 2)], connection=tx)
    tx.rollback()
    kept = add.apply_many([((3, 3), {}), ((4, 4), {})], connection=tx)
    assert count_rows(db, *(r.id for r in kept)) == 0
    tx.commit()
    assert count_rows(db, *(r.id for r in rolled_back)) == 0
    with worker_factory():
        assert [r.get(timeout=10) for r in kept] == [6, 8]


def test_psycopg_transaction_block_on_an_autocommit_connection(
    app: Celery, add: Any, pg_dsn: str, db: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        with pytest.raises(RuntimeError), conn.transaction():
            gone = add.apply_async((1, 1), connection=conn)
            raise RuntimeError("the caller's work failed")
        with conn.transaction():
            kept = add.apply_async((2, 2), connection=conn)
    assert count_rows(db, gone.id) == 0
    assert count_rows(db, kept.id) == 1


def test_app_transaction_binds_delay_apply_async_and_send_task(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any], worker_factory
) -> None:
    with app.transaction(tx):
        a = add.delay(1, 2)
        b = add.apply_async((3, 4), countdown=0)
        c = app.send_task("tx.add", (5, 6))
        many = add.apply_many([(7, 8)])
    ids = [a.id, b.id, c.id, many[0].id]
    assert count_rows(db, *ids) == 0
    tx.commit()
    assert count_rows(db, *ids) == 4
    with worker_factory():
        assert [r.get(timeout=10) for r in (a, b, c, many[0])] == [3, 7, 11, 15]


def test_app_transaction_rolled_back_runs_nothing(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any]
) -> None:
    with app.transaction(tx):
        ids = [add.delay(i, i).id for i in range(3)]
    tx.rollback()
    assert count_rows(db, *ids) == 0


def test_app_transaction_is_scoped_to_its_thread_and_block(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any]
) -> None:
    other: list[str] = []
    with app.transaction(tx):
        inside = add.delay(1, 1)
        thread = threading.Thread(target=lambda: other.append(add.delay(2, 2).id))
        thread.start()
        thread.join()
    after = add.delay(3, 3)
    # The other thread and the call after the block used the app's pool: committed at once.
    assert count_rows(db, other[0], after.id) == 2
    assert count_rows(db, inside.id) == 0
    tx.rollback()
    assert count_rows(db, inside.id) == 0


def test_an_explicit_connection_wins_over_the_bound_one(
    app: Celery, add: Any, tx: psycopg.Connection[Any], pg_dsn: str, db: psycopg.Connection[Any]
) -> None:
    with psycopg.connect(pg_dsn) as second, app.transaction(tx):
        r = add.apply_async((1, 1), connection=second)
        second.commit()
    assert count_rows(db, r.id) == 1
    tx.rollback()


def test_sqlalchemy_session_on_psycopg(
    app: Celery, add: Any, pg_dsn: str, db: psycopg.Connection[Any], worker_factory
) -> None:
    sqlalchemy = pytest.importorskip("sqlalchemy", reason="SQLAlchemy is not installed")
    from sqlalchemy.orm import Session

    url = "postgresql+psycopg://" + pg_dsn.split("://", 1)[1]
    engine = sqlalchemy.create_engine(url)
    try:
        with Session(engine) as session:
            with app.transaction(session):
                doomed = add.delay(1, 1)
            session.rollback()
            with app.transaction(session):
                session.execute(sqlalchemy.text("SELECT 1"))
                kept = add.delay(20, 22)
            assert count_rows(db, kept.id) == 0
            session.commit()
        with engine.connect() as conn:
            with app.transaction(conn):
                also = add.delay(1, 2)
            conn.commit()
    finally:
        engine.dispose()
    assert count_rows(db, doomed.id) == 0
    with worker_factory():
        assert kept.get(timeout=10) == 42
        assert also.get(timeout=10) == 3


def test_a_connection_that_is_not_psycopg_3_is_refused(app: Celery, add: Any) -> None:
    with pytest.raises(ImproperlyConfigured, match="psycopg 3"):
        add.apply_async((1, 1), connection=object())
    with pytest.raises(ImproperlyConfigured, match="psycopg 3"), app.transaction(object()):
        pass


def test_canvas_enqueues_join_the_bound_transaction(
    app: Celery, add: Any, tx: psycopg.Connection[Any], db: psycopg.Connection[Any], worker_factory
) -> None:
    from pgtasks.canvas import chain, group

    with app.transaction(tx):
        doomed = group(add.s(1, 1), add.s(2, 2)).apply_async()
    tx.rollback()
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
    assert doomed is not None
    with app.transaction(tx):
        kept = chain(add.s(1, 2), add.s(10)).apply_async()
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)
    tx.commit()
    with worker_factory():
        assert kept.get(timeout=10) == 13
