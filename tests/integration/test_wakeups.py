"""Wake-ups of waiting workers against a real PostgreSQL: a single enqueue notifies only while
a worker of its queue waits in parked_workers (a notifying commit holds a cluster-wide lock
through its flush, so notifying on every enqueue made producers commit one at a time), and an
enqueue that looked for a waiting worker as one parked still reaches it."""

from __future__ import annotations

import random
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.broker import notify_channel
from pgtasks.maintenance import Reclaimer
from tests.apps.harness import rows, status, wait_until


@pytest.fixture
def woken(pg_dsn: str, app: Celery) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening where enqueues wake waiting workers."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(notify_channel(app.broker.schema))))
        yield conn


def wakeups(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.3, stop_after=1)]


def wait_for(app: Celery, seconds: float = 60.0, queues: tuple[str, ...] = ("celery",)) -> None:
    """Park a worker called "ghost" that takes no hand-offs: notifications only."""
    app.broker.park("ghost", list(queues), 30.0, seconds, handoff=False)


def test_a_single_enqueue_notifies_only_while_a_worker_of_its_queue_waits(
    app: Celery, db: psycopg.Connection[Any], woken: psycopg.Connection[Any]
) -> None:
    @app.task(name="wake.any")
    def anything() -> None:
        pass

    first = anything.delay()
    assert wakeups(woken) == []

    wait_for(app, queues=("other",))
    anything.delay()
    assert wakeups(woken) == []

    wait_for(app)
    second = anything.delay()
    assert wakeups(woken) == ["celery"]
    # A worker that takes no hand-offs is woken, never handed the task.
    assert status(db, second.id) == "PENDING"
    assert rows(db, "SELECT worker FROM parked_workers WHERE NOT handoff") == [{"worker": "ghost"}]

    # A wait that ran out (by the database clock) wakes no one.
    wait_for(app, seconds=-1.0)
    anything.delay()
    assert wakeups(woken) == []
    # Nothing was lost either way: the rows wait for a claim.
    assert status(db, first.id) == "PENDING"


def test_enqueues_in_a_transaction_and_in_bulk_always_notify(
    app: Celery, db: psycopg.Connection[Any], woken: psycopg.Connection[Any]
) -> None:
    """Their commit may come long after the statement (or carries many rows): they notify
    as before, whether or not a worker waits."""

    @app.task(name="wake.any")
    def anything() -> None:
        pass

    with app.broker.connection() as conn, conn.transaction():
        anything.apply_async(connection=conn)
    assert wakeups(woken) == ["celery"]
    anything.apply_many([((), {}), ((), {})])
    assert wakeups(woken) == ["celery"]


def test_a_park_waits_for_an_enqueue_that_found_no_worker_waiting(
    pg_dsn: str, app: Celery, db: psycopg.Connection[Any], woken: psycopg.Connection[Any]
) -> None:
    """The race the gate closes: an enqueue that looked for a waiting worker (none) commits
    before the park that follows, so the worker's claim after parking finds its row."""

    @app.task(name="wake.any")
    def anything() -> None:
        pass

    # Every insert into tasks waits, its row written but not committed, until this session
    # lets go of a lock: a single enqueue's commit held back.
    key = random.randrange(2**40)
    db.execute(
        sql.SQL(
            "CREATE FUNCTION hold() RETURNS trigger LANGUAGE plpgsql AS $$"
            " BEGIN PERFORM pg_advisory_xact_lock_shared({key}); RETURN NULL; END $$;"
            " CREATE TRIGGER hold AFTER INSERT ON tasks FOR EACH ROW EXECUTE FUNCTION hold()"
        ).format(key=sql.Literal(key))
    )
    db.execute("SELECT pg_advisory_lock(%s)", (key,))
    sent: list[str] = []
    enqueue = threading.Thread(target=lambda: sent.append(anything.delay().id))
    enqueue.start()
    held = (
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND NOT granted"
        f" AND (classid::bigint << 32 | objid::bigint) = {key}"
    )
    wait_until(lambda: rows(db, held), what="the enqueue to wait before its commit")
    parked = threading.Event()

    def park() -> None:
        wait_for(app)
        parked.set()

    thread = threading.Thread(target=park)
    thread.start()
    wait_until(
        lambda: rows(
            db,
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
            "AND wait_event = 'advisory' AND query LIKE '%%parked_workers%%'"
            f" AND pid NOT IN ({held})",
        ),
        what="the park to wait for the enqueue",
    )
    assert not parked.is_set()
    db.execute("SELECT pg_advisory_unlock(%s)", (key,))
    enqueue.join(timeout=10)
    thread.join(timeout=10)
    assert parked.is_set()
    # The enqueue found no one waiting and sent nothing, and it committed first: the claim
    # after the park finds its row.
    assert wakeups(woken) == []
    claimed = app.broker.claim_all("ghost", ["celery"], 10, 30.0)
    assert [row.id for row in claimed] == sent


def test_a_worker_that_takes_no_hand_offs_is_woken_by_a_delay(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """With polls half a minute apart, only the notification can start the task soon."""
    app.conf.handoff = False

    @app.task(name="wake.echo")
    def echo(value: int) -> int:
        return value

    with worker_factory(concurrency=1, poll_interval=30.0) as worker:
        wait_until(
            lambda: rows(
                db, "SELECT 1 FROM parked_workers WHERE worker = %s AND NOT handoff", (worker.id,)
            ),
            timeout=10.0,
            what="the worker to wait",
        )
        assert echo.delay(7).get(timeout=10) == 7
        assert echo.delay(8).get(timeout=10) == 8


def test_a_worker_back_at_work_is_still_woken_while_its_slots_free_up(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """A worker that claimed work the usual way stops taking hand-offs but stays woken for a
    while (it parks again only after a back-off): a delay then still starts at once."""
    gate = threading.Event()

    @app.task(name="wake.hold")
    def hold() -> None:
        gate.wait(10)

    @app.task(name="wake.echo")
    def echo(value: int) -> int:
        return value

    with worker_factory(concurrency=2, poll_interval=30.0) as worker:
        wait_until(
            lambda: rows(db, "SELECT 1 FROM parked_workers WHERE worker = %s", (worker.id,)),
            timeout=10.0,
            what="the worker to park",
        )
        # Claimed, not handed off: the worker goes back to work, its row kept for wake-ups.
        held = hold.apply_many([((), {})])
        wait_until(lambda: status(db, held[0].id) == "RUNNING", what="the task to start")
        wait_until(
            lambda: rows(
                db, "SELECT 1 FROM parked_workers WHERE worker = %s AND NOT handoff", (worker.id,)
            ),
            what="the worker to stop taking hand-offs",
        )
        try:
            assert echo.delay(5).get(timeout=10) == 5
        finally:
            gate.set()


def test_the_waits_of_killed_workers_are_passed_over_then_forgotten(
    app: Celery, db: psycopg.Connection[Any], woken: psycopg.Connection[Any]
) -> None:
    """A worker killed while parked leaves its row behind. Once its wait has run out (by the
    database clock), enqueues neither hand it a task nor wake anyone for it, and the
    reclaimer deletes the row a minute later; live waits stay."""

    @app.task(name="wake.any")
    def anything() -> None:
        pass

    app.broker.park("killed", ["celery"], 30.0, -61.0)
    app.broker.park("just-ran-out", ["celery"], 30.0, -1.0)
    app.broker.park("waiting", ["other"], 30.0, 60.0)

    result = anything.delay()
    assert status(db, result.id) == "PENDING"
    assert wakeups(woken) == []

    Reclaimer(app.broker, 3).run_once()
    left = rows(db, "SELECT worker FROM parked_workers ORDER BY worker")
    assert [r["worker"] for r in left] == ["just-ran-out", "waiting"]
    # The row of a worker that parks again is written anew.
    app.broker.park("killed", ["celery"], 30.0, 60.0)
    anything.delay()
    assert [r["worker"] for r in rows(db, "SELECT worker FROM parked_workers")] == [
        "just-ran-out",
        "waiting",
    ]
    assert wakeups(woken) == []
