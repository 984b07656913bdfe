"""Unique tasks against a real PostgreSQL: a second enqueue of a held key returns the holder,
decided by the database even when many producer processes enqueue the same key at once."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.records import Release
from tests.apps.harness import REPO, one, rows, status, wait_until
from tests.apps.unique_producer import GATE


def holders(db: psycopg.Connection[Any], key: str) -> list[str]:
    return [r["id"] for r in rows(db, "SELECT id FROM tasks WHERE unique_key = %s", (key,))]


def count_tasks(db: psycopg.Connection[Any]) -> int:
    return int(one(db, "SELECT count(*) AS n FROM tasks")["n"])


@pytest.fixture
def work(app: Celery) -> Any:
    @app.task(name="unique.work")
    def work(n: int) -> int:
        return n

    return work


# -- keys and modes -----------------------------------------------------------------------------


def test_a_held_key_returns_the_holder_and_writes_nothing(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    first = work.apply_async((1,), unique_key="invoice:42")
    again = work.apply_async((2,), unique_key="invoice:42")
    other = work.apply_async((3,), unique_key="invoice:43")
    plain = work.delay(4)
    assert again.id == first.id
    assert len({first.id, other.id, plain.id}) == 3
    assert count_tasks(db) == 3
    # The holder keeps its own arguments: the second call was not written anywhere.
    assert one(db, "SELECT payload FROM tasks WHERE id = %s", (first.id,))["payload"][0] == [1]
    # send_task and a lone signature take the same option.
    assert app.send_task("unique.work", (5,), unique_key="invoice:42").id == first.id
    assert work.s(6).set(unique_key="invoice:42").apply_async().id == first.id
    assert count_tasks(db) == 3
    # Keys are held per task: the same key on another task is another key.
    assert app.send_task("unique.other", (7,), unique_key="invoice:42").id != first.id
    assert holders(db, "unique.work:invoice:42") == [first.id]
    assert count_tasks(db) == 4


def test_unique_on_names_arguments_and_a_function_may_compute_the_key(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="unique.sync", unique_on=("customer_id",))
    def sync(customer_id: int, full: bool = False) -> None:
        pass

    @app.task(name="unique.bound", bind=True, unique_on=("region", "day"))
    def bound(self: Any, region: str, day: str, verbose: bool = False) -> None:
        pass

    def order_key(order: int, **kw: Any) -> str | None:
        return f"order:{order}" if order else None

    @app.task(name="unique.custom", unique_on=order_key)
    def custom(order: int, note: str = "") -> None:
        pass

    a = sync.delay(1)
    assert sync.delay(1, full=True).id == a.id
    assert sync.delay(customer_id=1).id == a.id
    assert sync.delay(2).id != a.id
    assert holders(db, 'unique.sync:{"customer_id":1}') == [a.id]

    b = bound.delay("eu", "mon")
    assert bound.delay(region="eu", day="mon", verbose=True).id == b.id
    assert bound.delay("us", "mon").id != b.id

    c = custom.delay(7, note="x")
    assert custom.delay(7).id == c.id
    assert holders(db, "unique.custom:order:7") == [c.id]  # keys are held per task
    # The function says None: that call is not unique.
    assert custom.delay(0).id != custom.delay(0).id
    # A call's own key wins over unique_on.
    assert sync.apply_async((1,), unique_key="mine").id != a.id


def test_bad_unique_options_are_clear_errors_that_write_nothing(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    with pytest.raises(ImproperlyConfigured, match=r"unique_on names \['customer'\]"):

        @app.task(name="unique.bad_name", unique_on=("customer",))
        def bad_name(customer_id: int) -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="sequence of argument names"):

        @app.task(name="unique.bad_type", unique_on="customer_id")
        def bad_type(customer_id: int) -> None:
            pass

    with pytest.raises(ImproperlyConfigured, match="unique_for must be"):

        @app.task(name="unique.bad_for", unique_on=("n",), unique_for="forever")
        def bad_for(n: int) -> None:
            pass

    with pytest.raises(ValueError, match="positive, finite"):
        work.apply_async((1,), unique_key="k", unique_for=timedelta(0))
    with pytest.raises(ValueError, match="unique_for needs a key"):
        work.apply_async((1,), unique_for=60)
    with pytest.raises(TypeError, match="non-empty string"):
        work.apply_async((1,), unique_key=42)
    with pytest.raises(ValueError, match="NUL"):
        work.apply_async((1,), unique_key="a\x00b")

    @app.task(name="unique.sync", unique_on=("customer_id",))
    def sync(customer_id: int) -> None:
        pass

    with pytest.raises(TypeError, match=r"unique\.sync"):
        sync.delay()  # the argument it is unique on is missing
    with pytest.raises(ValueError, match="cannot be part of a chain, group or chord"):
        (work.s(1).set(unique_key="k") | work.s()).apply_async()
    with pytest.raises(ValueError, match="cannot be part of a chain, group or chord"):
        from pgtasks import group

        group(sync.s(1), sync.s(2)).apply_async()
    assert count_tasks(db) == 0


def test_finished_holds_while_waiting_or_running_started_only_until_claimed(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    broker = app.broker
    first = work.apply_async((1,), unique_key="f")
    early = work.apply_async((1,), unique_key="s", unique_for="started")
    assert work.apply_async((1,), unique_key="s", unique_for="started").id == early.id
    claimed = {row.id: row for row in broker.claim("w1", ["celery"], 10, 60.0)}
    assert set(claimed) == {first.id, early.id}

    # Running: "finished" still holds, "started" has let go.
    assert work.apply_async((2,), unique_key="f").id == first.id
    later = work.apply_async((2,), unique_key="s", unique_for="started")
    assert later.id != early.id

    # The started one goes back to waiting (a release gives its claim back): it does not take
    # the key back, and nothing fails for the row that holds it now.
    row = claimed[early.id]
    assert broker.release("w1", [Release(row.id, row.attempt, 0.0, None)]) == {early.id: "PENDING"}
    assert status(db, early.id) == "PENDING"
    assert work.apply_async((3,), unique_key="s", unique_for="started").id == later.id

    # The finished one completes: the key is free.
    db.execute("UPDATE tasks SET status = 'COMPLETED' WHERE id = %s", (first.id,))
    fresh = work.apply_async((4,), unique_key="f")
    assert fresh.id != first.id
    assert work.apply_async((5,), unique_key="f").id == fresh.id


def test_a_window_holds_the_key_whatever_the_task_does_then_lets_go(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    first = work.apply_async((1,), unique_key="w", unique_for=timedelta(minutes=10))
    db.execute("UPDATE tasks SET status = 'COMPLETED' WHERE id = %s", (first.id,))
    assert work.apply_async((2,), unique_key="w", unique_for=600).id == first.id
    # The window passes (moved on the database's clock, not by waiting).
    db.execute("UPDATE unique_keys SET held_until = now() - interval '1 second'")
    second = work.apply_async((3,), unique_key="w", unique_for=600)
    assert second.id != first.id
    assert (
        one(db, "SELECT task_id FROM unique_keys WHERE key = 'unique.work:w'")["task_id"]
        == second.id
    )
    # The pruner removes lapsed keys.
    db.execute("UPDATE unique_keys SET held_until = now() - interval '1 second'")
    app.broker.prune(3600.0, 3600.0)
    assert rows(db, "SELECT * FROM unique_keys") == []


def test_apply_many_returns_the_holders_in_one_transaction(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    held = work.apply_async((0,), unique_key="batch")
    results = work.apply_many([(1,), (2,)], unique_key="batch")
    assert [r.id for r in results] == [held.id, held.id]

    @app.task(name="unique.by_n", unique_on=("n",))
    def by_n(n: int) -> int:
        return n

    results = by_n.apply_many([(1,), (2,), (1,)])
    assert results[0].id == results[2].id != results[1].id
    assert count_tasks(db) == 3


def test_a_requeued_dead_letter_gives_up_a_key_a_newer_task_holds(
    app: Celery, db: psycopg.Connection[Any], work: Any
) -> None:
    old = work.apply_async((1,), unique_key="dl")
    db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", (old.id,))
    new = work.apply_async((2,), unique_key="dl")
    assert new.id != old.id
    assert app.broker.requeue_dead(ids=[old.id]) == 1
    assert status(db, old.id) == "PENDING"
    assert holders(db, "unique.work:dl") == [new.id]


def test_a_worker_runs_a_unique_task_then_the_key_is_free(
    app: Celery, db: psycopg.Connection[Any], work: Any, worker_factory: Any
) -> None:
    first = work.apply_async((1,), unique_key="run")
    with worker_factory():
        assert first.get(timeout=10) == 1
        second = work.apply_async((2,), unique_key="run")
        assert second.id != first.id
        assert second.get(timeout=10) == 2


# -- races between producer processes ------------------------------------------------------------


@contextlib.contextmanager
def gate(pg_dsn: str) -> Iterator[psycopg.Connection[Any]]:
    """Hold the producers' starting gate until the block lets go of it."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute("SELECT pg_advisory_lock(%s)", (GATE,))
        try:
            yield conn
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (GATE,))


def race(pg_dsn: str, schema: str, mode: str, key: str, procs: int, each: int) -> list[str]:
    """``procs`` producer processes enqueue ``each`` calls of ``key`` at once; every id they
    got back."""
    env = dict(os.environ)
    env.update(
        PGTASKS_DATABASE_URL=pg_dsn,
        PGTASKS_SCHEMA_NAME=schema,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    with gate(pg_dsn) as holder:
        producers = [
            subprocess.Popen(
                [sys.executable, "-m", "tests.apps.unique_producer", mode, key, str(each)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(procs)
        ]

        def waiting() -> bool:
            found = holder.execute(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objid = %s "
                "AND NOT granted",
                (GATE,),
            ).fetchone()
            return bool(found and found[0] == procs)

        wait_until(waiting, timeout=60, what="every producer at the gate")
    ids: list[str] = []
    for p in producers:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
        ids += json.loads(out.strip().splitlines()[-1])
    return ids


@pytest.mark.parametrize("mode", ["finished", "started", "600"])
def test_producers_racing_on_one_key_insert_exactly_one_task(
    pg_dsn: str, schema: str, db: psycopg.Connection[Any], mode: str
) -> None:
    ids = race(pg_dsn, schema, mode, f"race-{mode}", procs=6, each=25)
    assert len(ids) == 150
    assert count_tasks(db) == 1
    (only,) = rows(db, "SELECT id FROM tasks")
    assert set(ids) == {only["id"]}


def test_producers_racing_with_holders_that_finish_never_see_two_holders(
    pg_dsn: str, schema: str, db: psycopg.Connection[Any]
) -> None:
    """The key changes hands as producers race: each holder is finished by another connection
    as soon as it appears. Every id handed back is a real task, and no two tasks ever held
    the key at once (the index refuses the second; the audit below checks the result)."""
    stop = threading.Event()
    finished: list[str] = []

    def finisher() -> None:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(f'SET search_path TO "{schema}"')
            while not stop.is_set():
                done = conn.execute(
                    "UPDATE tasks SET status = 'COMPLETED', updated_at = clock_timestamp() "
                    "WHERE unique_key = 'unique.work:churn' AND status = 'PENDING' RETURNING id"
                ).fetchall()
                finished.extend(r[0] for r in done)

    thread = threading.Thread(target=finisher, daemon=True)
    thread.start()
    try:
        ids = race(pg_dsn, schema, "finished", "churn", procs=6, each=25)
    finally:
        stop.set()
        thread.join()
    written = {
        r["id"] for r in rows(db, "SELECT id FROM tasks WHERE unique_key = 'unique.work:churn'")
    }
    assert set(ids) <= written  # every id handed back names a task that was written
    assert len(written) > 1  # the key did change hands
    assert set(finished) <= written
    # At most one holder now, and every other one was finished before the next got in.
    waiting = rows(
        db, "SELECT id FROM tasks WHERE unique_key = 'unique.work:churn' AND status = 'PENDING'"
    )
    assert len(waiting) <= 1
    assert len(written) - len(waiting) == len(set(finished))
