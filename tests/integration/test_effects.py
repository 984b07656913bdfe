"""Idempotent effects against a real PostgreSQL: a task run again skips an effect an earlier run
of it committed; an effect in a transaction commits with its writes or not at all."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.request import Request
from tests.apps.harness import one, rows


@pytest.fixture
def ledger(db: psycopg.Connection[Any]) -> str:
    db.execute("CREATE TABLE ledger (task_id text, amount int)")
    return "ledger"


def connect(pg_dsn: str, schema: str, autocommit: bool = True) -> psycopg.Connection[Any]:
    conn = psycopg.connect(pg_dsn, autocommit=autocommit)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
    if not autocommit:
        conn.commit()
    return conn


@contextlib.contextmanager
def running(task: Any, task_id: str) -> Iterator[None]:
    """Run the block as a run of ``task`` with id ``task_id`` (as the worker would)."""
    task.push_request(Request(id=task_id))
    try:
        yield
    finally:
        task.pop_request()


def ledger_rows(db: psycopg.Connection[Any]) -> list[tuple[str, int]]:
    return [(r["task_id"], r["amount"]) for r in rows(db, "SELECT * FROM ledger ORDER BY amount")]


def test_a_retried_task_skips_the_effect_its_first_run_committed(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    ledger: str,
    worker_factory: Any,
) -> None:
    conn = connect(pg_dsn, schema)
    runs: list[bool] = []

    @app.task(name="effects.settle", bind=True, max_retries=2)
    def settle(self: Any, amount: int) -> str:
        with conn.transaction(), self.effect("ledger", connection=conn) as first_time:
            runs.append(bool(first_time))
            if first_time:
                conn.execute("INSERT INTO ledger VALUES (%s, %s)", (self.request.id, amount))
        if self.request.retries == 0:
            # Fails after the effect committed, as a crash would: the retry runs it all again.
            raise self.retry(countdown=0)
        return "settled"

    result = settle.delay(10)
    with worker_factory(concurrency=1, pool="threads"):
        assert result.get(timeout=15) == "settled"
    conn.close()
    assert runs == [True, False]
    assert ledger_rows(db) == [(result.id, 10)]
    assert one(db, "SELECT count(*) AS n FROM effects WHERE task_id = %s", (result.id,))["n"] == 1


def test_an_effect_that_fails_takes_its_record_back_even_if_the_transaction_commits(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, ledger: str
) -> None:
    @app.task(name="effects.pay", bind=True)
    def pay(self: Any) -> None:
        pass

    with connect(pg_dsn, schema) as conn, running(pay, "t-1"):
        with conn.transaction():
            with pytest.raises(ZeroDivisionError), pay.effect("charge", connection=conn) as e:
                assert e.first_time
                conn.execute("INSERT INTO ledger VALUES ('t-1', 1)")
                raise ZeroDivisionError
            conn.execute("INSERT INTO ledger VALUES ('t-1', 2)")  # the transaction goes on
        assert ledger_rows(db) == [("t-1", 2)]
        assert rows(db, "SELECT * FROM effects") == []
        # The next run does it.
        with conn.transaction(), pay.effect("charge", connection=conn) as again:
            assert again.first_time
        # And the one after that does not; an app.transaction binding is found by itself.
        with conn.transaction(), app.transaction(conn), pay.effect("charge") as third:
            assert not third.first_time
            assert not third


def test_a_non_autocommit_connection_is_a_transaction_an_effect_joins(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, ledger: str
) -> None:
    @app.task(name="effects.pay", bind=True)
    def pay(self: Any) -> None:
        pass

    with connect(pg_dsn, schema, autocommit=False) as conn, running(pay, "t-2"):
        with pay.effect("charge", connection=conn) as e:
            assert e.first_time
            conn.execute("INSERT INTO ledger VALUES ('t-2', 1)")
        conn.rollback()  # the caller's transaction decides: nothing happened
        assert rows(db, "SELECT * FROM effects") == []
        with pay.effect("charge", connection=conn) as e:
            assert e.first_time
            conn.execute("INSERT INTO ledger VALUES ('t-2', 1)")
        conn.commit()
    assert ledger_rows(db) == [("t-2", 1)]
    assert len(rows(db, "SELECT * FROM effects")) == 1


def test_a_second_run_racing_the_first_waits_for_its_commit_then_skips(
    app: Celery, pg_dsn: str, schema: str, ledger: str
) -> None:
    @app.task(name="effects.pay", bind=True)
    def pay(self: Any) -> None:
        pass

    recorded = threading.Event()
    release = threading.Event()
    seen: dict[str, bool] = {}

    def run(which: str, hold: bool) -> None:
        with (
            connect(pg_dsn, schema) as conn,
            running(pay, "t-3"),
            conn.transaction(),
            pay.effect("charge", connection=conn) as e,
        ):
            seen[which] = e.first_time
            if hold:
                recorded.set()
                release.wait(10)

    first = threading.Thread(target=run, args=("first", True))
    first.start()
    assert recorded.wait(10)
    second = threading.Thread(target=run, args=("second", False))
    second.start()
    second.join(0.5)
    assert second.is_alive()  # waiting on the first run's record
    release.set()
    first.join(10)
    second.join(10)
    assert seen == {"first": True, "second": False}


def test_an_effect_outside_the_database_is_recorded_when_its_block_succeeds(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="effects.mail", bind=True)
    def mail(self: Any) -> None:
        pass

    with running(mail, "t-4"):
        with pytest.raises(ConnectionError), mail.effect("email") as e:
            assert e.first_time
            assert e.key == "t-4:email"
            raise ConnectionError("the mail server is down")
        assert rows(db, "SELECT * FROM effects") == []
        with mail.effect("email") as e:
            assert e.first_time
        with mail.effect("email") as e:
            assert not e.first_time
            assert e.key == "t-4:email"  # the same on every run
        with mail.effect("sms") as e:
            assert e.first_time
    assert {r["name"] for r in rows(db, "SELECT name FROM effects")} == {"email", "sms"}


def test_effects_refuse_what_cannot_be_kept(app: Celery, pg_dsn: str, schema: str) -> None:
    @app.task(name="effects.pay", bind=True)
    def pay(self: Any) -> None:
        pass

    with pytest.raises(RuntimeError, match="none runs here"):
        pay.effect("charge")  # a direct call has no task id
    with connect(pg_dsn, schema) as conn, running(pay, "t-5"):
        with pytest.raises(ImproperlyConfigured, match="inside a transaction"):
            pay.effect("charge", connection=conn)  # autocommit, no transaction
        with pytest.raises(TypeError, match="non-empty string"):
            pay.effect("")
        with pytest.raises(ValueError, match="NUL"):
            pay.effect("a\x00b")


def test_pruning_a_task_removes_its_effects(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="effects.mail", bind=True)
    def mail(self: Any) -> None:
        pass

    done = mail.delay()
    kept = mail.delay()
    for task_id in (done.id, kept.id):
        with running(mail, task_id), mail.effect("email"):
            pass
    db.execute(
        "UPDATE tasks SET status = 'COMPLETED', updated_at = now() - interval '1 hour' "
        "WHERE id = %s",
        (done.id,),
    )
    app.broker.prune(60.0, 3600.0)
    assert [r["task_id"] for r in rows(db, "SELECT task_id FROM effects")] == [kept.id]
