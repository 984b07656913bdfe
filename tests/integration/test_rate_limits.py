"""Rate limits held by the database: start times one interval apart across every worker, later
rows handed back to wait for their time (their claim undone), unlimited tasks never held up."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import psycopg

from pgtasks import Celery
from pgtasks.worker import Worker
from tests.apps import coord
from tests.apps.harness import (
    advance_due,
    describe_all,
    executions,
    one,
    remote,
    rows,
    wait_until,
    worker_processes,
)

WorkerFactory = Callable[..., AbstractContextManager[Worker]]


def test_three_worker_processes_share_one_rate(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    every = 0.05  # coord.limited is "20/s"
    names = ["rate-a", "rate-b", "rate-c"]
    with worker_processes(pg_dsn, schema, names, ready=db, concurrency=4) as workers:
        limited = remote(app, coord.LIMITED)
        # All twelve due at once (one statement), however long each enqueue would take.
        ids = [r.id for r in limited.apply_many([()] * 12)]
        wait_until(
            lambda: len(rows(db, "SELECT 1 FROM executions")) == 12,
            timeout=20,
            what="twelve limited tasks to run",
            details=describe_all(workers),
        )
    runs = {i: executions(db, i) for i in ids}
    assert all(len(r) == 1 for r in runs.values()), "each task ran once"
    assert {r[0]["worker"] for r in runs.values()} <= set(names)
    # The start times handed out, whichever worker asked, are one interval apart or more, and
    # no task started before its own (both read on the database clock).
    slotted = rows(
        db,
        "SELECT id, (headers ->> 'rate_slot')::timestamptz AS slot FROM tasks "
        "WHERE id = ANY(%s) AND headers ? 'rate_slot' ORDER BY 2",
        (ids,),
    )
    assert len(slotted) >= 9, "most of the twelve waited for their slot"
    slots = [r["slot"] for r in slotted]
    assert all(b - a >= timedelta(seconds=every) for a, b in itertools.pairwise(slots))
    assert all(runs[r["id"]][0]["started_at"] >= r["slot"] for r in slotted)
    claims = rows(db, "SELECT attempt FROM tasks WHERE id = ANY(%s)", (ids,))
    assert {c["attempt"] for c in claims} == {1}, "waiting for a slot does not use up an attempt"
    # The next free slot comes one interval after the last one given.
    bucket = one(db, "SELECT next_at FROM rate_limits WHERE key = 'task:coord.limited'")
    assert bucket["next_at"] >= slots[-1] + timedelta(seconds=every)


def test_later_slots_wait_in_the_row_and_unlimited_tasks_go_on(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="rl.slow", rate_limit="1/m")
    def slow(n: int) -> int:
        return n

    @app.task(name="rl.free")
    def free(n: int) -> int:
        return n

    with worker_factory(concurrency=4):
        held = [slow.delay(n) for n in range(4)]
        assert [free.delay(n).get(timeout=10) for n in range(20)] == list(range(20))
        wait_until(
            lambda: (
                one(
                    db,
                    "SELECT count(*) AS n FROM tasks "
                    "WHERE name = 'rl.slow' AND status = 'COMPLETED'",
                )["n"]
                == 1
            ),
            what="the first limited task to run at once",
        )
        waiting = rows(
            db,
            "SELECT id, run_at, attempt, headers ? 'rate_slot' AS admitted FROM tasks "
            "WHERE name = 'rl.slow' AND status = 'PENDING' ORDER BY run_at",
        )
        assert len(waiting) == 3
        assert all(w["admitted"] and w["attempt"] == 0 for w in waiting)
        gaps = [b["run_at"] - a["run_at"] for a, b in itertools.pairwise(waiting)]
        assert gaps == [timedelta(minutes=1)] * 2, "one slot a minute"
        # Their time comes (moved by the database clock, not by waiting): they run as admitted,
        # without asking for new slots.
        advance_due(db)
        assert sorted(r.get(timeout=10) for r in held) == [0, 1, 2, 3]
    # Four slots were given, the first at once: the next free one is four minutes on.
    bucket = one(db, "SELECT next_at - now() AS ahead FROM rate_limits WHERE key = 'task:rl.slow'")
    assert timedelta(minutes=4) - timedelta(seconds=10) < bucket["ahead"] <= timedelta(minutes=4)


def test_a_retry_takes_a_new_slot(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="rl.again", bind=True, rate_limit="1/m", max_retries=1)
    def again(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "second run"

    with worker_factory():
        result = again.delay()
        # The first run took the free slot; the retry, due at once, waits a minute for the next.
        (row,) = wait_until(
            lambda: rows(
                db,
                "SELECT status, retries, run_at - now() AS wait FROM tasks "
                "WHERE id = %s AND headers ? 'rate_slot'",
                (result.id,),
            ),
            what="the retry to wait for its slot",
        )
        assert (row["status"], row["retries"]) == ("PENDING", 1)
        assert timedelta(seconds=50) < row["wait"] <= timedelta(minutes=1)
        advance_due(db)
        assert result.get(timeout=10) == "second run"


def test_disabled_rate_limits_run_everything_now(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    app.conf.worker_disable_rate_limits = True

    @app.task(name="rl.ignored", rate_limit="1/h")
    def hourly(n: int) -> int:
        return n

    with worker_factory(concurrency=2):
        assert [hourly.delay(n).get(timeout=10) for n in range(3)] == [0, 1, 2]
    assert rows(db, "SELECT * FROM rate_limits") == []


def test_the_claim_gives_start_times_and_leaves_later_rows_waiting(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="rl.claimed")
    def limited(n: int) -> int:
        return n

    @app.task(name="rl.other")
    def other(n: int) -> int:
        return n

    ids = [limited.delay(n).id for n in range(3)]
    expired = limited.apply_async((9,), expires=0.001).id
    free = other.delay(0).id
    db.execute("UPDATE tasks SET expires_at = now() - interval '1 s' WHERE id = %s", (expired,))
    rows_back = app.broker.claim_all("w1", ["celery"], 10, 30.0, rates={"rl.claimed": 60.0})
    started = {r.id for r in rows_back if r.set_aside is None}
    waiting = [r.id for r in rows_back if r.set_aside == "PENDING"]
    # The first limited row takes the free start time; an expired row takes none (it is
    # cancelled, not run); a task without a limit runs.
    assert started == {ids[0], expired, free}
    assert sorted(waiting) == sorted(ids[1:])
    later = rows(
        db,
        "SELECT id, status, attempt, claimed_by, run_at - now() AS wait, "
        "(headers ->> 'rate_slot')::timestamptz = run_at AS holds_slot "
        "FROM tasks WHERE id = ANY(%s) ORDER BY run_at",
        (ids[1:],),
    )
    assert [r["id"] for r in later] == ids[1:], "start times in claim order"
    assert all(
        (r["status"], r["attempt"], r["claimed_by"], r["holds_slot"]) == ("PENDING", 0, None, True)
        for r in later
    )
    assert [round(r["wait"].total_seconds()) for r in later] == [60, 120]
    # Not due yet: nothing more to claim. Once due, they run without asking again.
    assert app.broker.claim_all("w1", ["celery"], 10, 30.0, rates={"rl.claimed": 60.0}) == []
    advance_due(db)
    again = app.broker.claim_all("w1", ["celery"], 10, 30.0, rates={"rl.claimed": 60.0})
    assert sorted(r.id for r in again if r.set_aside is None) == sorted(ids[1:])


def test_a_claim_reading_further_sets_a_rate_limited_backlog_aside_and_claims_its_share(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="rl.backlog")
    def limited(n: int) -> int:
        return n

    @app.task(name="rl.plain")
    def plain(n: int) -> int:
        return n

    backlog = [r.id for r in limited.apply_many([(n,) for n in range(30)])]
    after = [r.id for r in plain.apply_many([(n,) for n in range(5)])]
    rates = {"rl.backlog": 60.0}
    got = app.broker.claim_all("w1", ["celery"], 2, 30.0, rates=rates, scan=100)
    claimed = [r.id for r in got if r.set_aside is None]
    # Two rows claimed: the first limited row (it takes the free start time) and the first
    # plain one. The claim read on past them and set the 29 other limited rows aside at once.
    assert claimed == [backlog[0], after[0]]
    assert sorted(r.id for r in got if r.set_aside == "PENDING") == sorted(backlog[1:])
    statuses = rows(db, "SELECT status FROM tasks WHERE id = ANY(%s)", (after[1:],))
    assert [r["status"] for r in statuses] == ["PENDING"] * 4, "read, not claimed"
    left = app.broker.claim_all("w1", ["celery"], 10, 30.0, rates=rates)
    assert sorted(r.id for r in left) == sorted(after[1:])


def test_a_start_time_given_is_never_left_unused(app: Celery, db: psycopg.Connection[Any]) -> None:
    @app.task(name="rl.late")
    def limited(n: int) -> int:
        return n

    @app.task(name="rl.early")
    def plain(n: int) -> int:
        return n

    first = [r.id for r in plain.apply_many([(n,) for n in range(3)])]
    late = limited.delay(0).id
    got = app.broker.claim_all("w1", ["celery"], 1, 30.0, rates={"rl.late": 60.0}, scan=10)
    # One row asked for, but the limited row read beyond it took its start time: it is
    # claimed too, rather than given a time and left.
    assert [r.id for r in got] == [first[0], late]
    assert all(r.set_aside is None for r in got)


def test_a_rate_limit_made_invalid_after_definition_does_not_stop_the_worker(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(name="rl.junk", rate_limit="1/h")
    def junk(n: int) -> int:
        return n

    @app.task(name="rl.kept", rate_limit="1/h")
    def kept(n: int) -> int:
        return n

    junk.rate_limit = "often"  # type: ignore[attr-defined]
    with worker_factory(concurrency=2):
        # The junk limit is not held (it is logged); the valid one still is.
        assert [junk.delay(n).get(timeout=10) for n in range(3)] == [0, 1, 2]
        held = [kept.delay(n) for n in range(2)]
        assert held[0].get(timeout=10) == 0
        wait_until(
            lambda: rows(
                db, "SELECT 1 FROM tasks WHERE id = %s AND headers ? 'rate_slot'", (held[1].id,)
            ),
            what="the second kept task to wait for its start time",
        )
