"""The reclaimer's floor never moves past an expired lease it did not take back.

Once a full reclaim is slow, calls start from a floor (see ``pgtasks.maintenance.Reclaimer``)
and the next full call may be minutes away. A lease that ran out while another transaction
held its row (a concurrent reclaim, a renewal or an outcome write, any of them rolled back by a
killed worker or a restarted server) is skipped by ``SKIP LOCKED``: were the floor to move on
regardless, the row would stay RUNNING with its lease long expired until that full call.

Leases are set on the database clock (``now()``), so nothing here sleeps.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from types import SimpleNamespace
from typing import Any

import psycopg
from psycopg import sql

from pgtasks import Celery, maintenance
from pgtasks.maintenance import Reclaimer
from pgtasks.sql import queries
from pgtasks.worker.floors import Gate
from tests.apps.harness import one

WORKER = "reclaim-floor-test@host"


def running(app: Celery, db: psycopg.Connection[Any], n: int) -> list[str]:
    """``n`` RUNNING rows owned by a worker that is gone, leases still live."""
    db.execute(
        "INSERT INTO tasks (id, name, payload)"
        " SELECT gen_random_uuid()::text, 'floor.noop', '[[], {}, {}]'"
        "   FROM generate_series(1, %s)",
        (n,),
    )
    return [r.id for r in app.broker.claim(WORKER, ["celery"], n, 30.0)]


def expire(db: psycopg.Connection[Any], task_id: str, ago: str) -> None:
    db.execute("UPDATE tasks SET lease_until = now() - %s::interval WHERE id = %s", (ago, task_id))


def status(db: psycopg.Connection[Any], task_id: str) -> str:
    return str(one(db, "SELECT status FROM tasks WHERE id = %s", (task_id,))["status"])


@contextmanager
def row_held(pg_dsn: str, schema: str, task_id: str) -> Iterator[None]:
    """Another transaction holds the row's lock (as a reclaim, a renewal or an outcome write
    does), then rolls back, as the transaction of a killed worker or a restarted server does."""
    with psycopg.connect(pg_dsn) as other:
        other.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        other.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task_id,))
        try:
            yield
        finally:
            other.rollback()


def on_floors() -> Gate:
    """Floors after every full call, and no full call for an hour: a worker whose full
    reclaims were slow, between two of them."""
    return Gate(slow=0.0, min_full_every=3600.0)


def test_a_lease_skipped_while_its_row_was_held_is_taken_by_the_next_call(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    held, free = running(app, db, 2)
    expire(db, held, "1 minute")
    expire(db, free, "1 minute")
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = on_floors()
    with row_held(pg_dsn, schema, held):
        assert reclaimer.run_once() == 1  # full: takes the free row, skips the held one
    assert (status(db, held), status(db, free)) == ("RUNNING", "PENDING")
    # The holder rolled back: the lease is expired and its row free. The next call starts
    # from the floor the full one left, and must not have left this lease behind it.
    assert reclaimer.run_once() == 1
    assert status(db, held) == "PENDING"


def test_leases_a_killed_worker_was_reclaiming_are_taken_by_the_next_call(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    # Another worker's reclaim takes the rows first, and its worker is killed before it
    # commits: its transaction rolls back and leaves them RUNNING, expired, free.
    ids = running(app, db, 3)
    for task_id in ids:
        expire(db, task_id, "1 minute")
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = on_floors()
    with psycopg.connect(pg_dsn) as killed:
        killed.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        params = {"max_lost": 3, "limit": 1000, "floor": None}
        taken = killed.execute(queries(schema)["reclaim_expired"], params).fetchall()
        assert len(taken) == 3
        assert reclaimer.run_once() == 0  # full: every expired row is held
        killed.rollback()
    assert [status(db, i) for i in ids] == ["RUNNING"] * 3
    assert reclaimer.run_once() == 3
    assert [status(db, i) for i in ids] == ["PENDING"] * 3


def test_a_lease_skipped_by_a_call_from_the_floor_is_taken_by_the_next_one(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, monkeypatch: Any
) -> None:
    # With no margin, a call's floor is the last call's cutoff: a lease that ran out just before
    # a call that skipped it is behind the floor of the call after, unless the floor waits.
    monkeypatch.setattr(Reclaimer, "FLOOR_MARGIN", timedelta(0))
    held, later = running(app, db, 2)
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = on_floors()
    assert reclaimer.run_once() == 0  # full: sets the floor, then floors only
    expire(db, held, "0 seconds")
    with row_held(pg_dsn, schema, held):
        assert reclaimer.run_once() == 0  # from the floor: the held row is skipped
    assert status(db, held) == "RUNNING"
    # The next call takes it, and what ran out since.
    expire(db, later, "0 seconds")
    assert reclaimer.run_once() == 2
    assert (status(db, held), status(db, later)) == ("PENDING", "PENDING")


def test_a_lease_held_through_several_calls_keeps_the_floor_behind_it(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    [held] = running(app, db, 1)
    expire(db, held, "10 minutes")
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = on_floors()
    with row_held(pg_dsn, schema, held):
        assert [reclaimer.run_once() for _ in range(3)] == [0, 0, 0]
    assert reclaimer.run_once() == 1
    assert status(db, held) == "PENDING"


def test_a_lease_skipped_in_a_backlog_is_taken_by_the_next_batch(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, monkeypatch: Any
) -> None:
    # A full batch is followed by one from the last lease it took back: not from past a lease
    # it skipped.
    monkeypatch.setattr(Reclaimer, "BATCH", 2)
    ids = running(app, db, 4)
    for i, task_id in enumerate(ids):
        expire(db, task_id, f"{10 - i} minutes")
    held = ids[0]  # the oldest
    reclaimer = Reclaimer(app.broker, 3)
    reclaimer.gate = on_floors()
    with row_held(pg_dsn, schema, held):
        assert reclaimer.run_once() == 2  # full, and full: the next one goes on from here
    assert [status(db, i) for i in ids] == ["RUNNING", "PENDING", "PENDING", "RUNNING"]
    assert reclaimer.run_once() == 2
    assert [status(db, i) for i in ids] == ["PENDING"] * 4


def test_a_slow_full_call_puts_the_next_one_off_by_a_minute_at_most(
    app: Celery, db: psycopg.Connection[Any], monkeypatch: Any
) -> None:
    # The first full call after a server restart may wait seconds for a connection, and counts
    # as a slow one: calls from floors follow, and only a full call takes back a lease that was
    # committed behind a floor. It must come within a minute, not fifty times that wait later.
    clock = [0.0]
    monkeypatch.setattr(maintenance, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    floors: list[datetime | None] = []
    reclaim_from = app.broker.reclaim_from

    def spy(floor: datetime | None, *args: Any, **kwargs: Any) -> Any:
        floors.append(floor)
        if len(floors) == 1:
            clock[0] += 10.0  # waited for the server
        return reclaim_from(floor, *args, **kwargs)

    monkeypatch.setattr(app.broker, "reclaim_from", spy)
    reclaimer = Reclaimer(app.broker, 3)
    [late] = running(app, db, 1)
    reclaimer.run_once()
    expire(db, late, "1 hour")  # as a lease committed late behind its own time would be
    clock[0] += 30.0
    reclaimer.run_once()
    assert status(db, late) == "RUNNING"  # from the floor: not seen
    clock[0] += 60.0
    reclaimer.run_once()
    assert floors[0] is None and floors[1] is not None and floors[2] is None
    assert status(db, late) == "PENDING"
