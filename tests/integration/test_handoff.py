"""Direct hand-off against a real PostgreSQL: an idle worker parks, a single enqueue of a task
that can start now takes that park and names the row to the worker by NOTIFY, the worker claims
that row, and every way of missing that notification (a worker that died parked, a listening
connection that broke, a stop) still runs the task once."""

from __future__ import annotations

import asyncio
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from structlog.testing import capture_logs

from pgtasks import Celery, grants
from pgtasks.broker import handed_ids, handoff_channel
from pgtasks.migrate import migrate
from pgtasks.worker import Worker
from tests.apps.harness import (
    Row,
    attempts,
    note_inserts,
    one,
    rows,
    status,
    task_row,
    wait_until,
)


@pytest.fixture
def listening(pg_dsn: str, app: Celery) -> Iterator[psycopg.Connection[Any]]:
    """A connection listening on the hand-off channel of a worker called "ghost"."""
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        channel = handoff_channel(app.broker.schema, "ghost")
        conn.execute(sql.SQL("LISTEN {}").format(sql.Identifier(channel)))
        yield conn


def park_ghost(app: Celery, seconds: float = 60.0, **options: Any) -> None:
    options.setdefault("queues", ["celery"])
    options.setdefault("lease", 30.0)
    app.broker.park("ghost", seconds=seconds, **options)


def notes(conn: psycopg.Connection[Any]) -> list[str]:
    return [n.payload for n in conn.notifies(timeout=0.5, stop_after=1)]


def parked(db: psycopg.Connection[Any], worker: str) -> bool:
    """Whether ``worker`` is parked for hand-offs (not only woken by notifications)."""
    found = rows(db, "SELECT 1 FROM parked_workers WHERE worker = %s AND handoff", (worker,))
    return bool(found)


def test_an_enqueue_names_its_row_to_a_parked_worker_which_claims_it(
    app: Celery, db: psycopg.Connection[Any], listening: psycopg.Connection[Any]
) -> None:
    @app.task(name="handoff.add")
    def add(x: int, y: int) -> int:
        return x + y

    park_ghost(app, lease=7.0)
    sent = add.apply_async((2, 3), priority=4, expires=600)
    # The row is a waiting row like any other: only the worker's claim makes it RUNNING.
    row = task_row(db, sent.id)
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("PENDING", None, 0)
    # The park is used up: the next task waits for a claim.
    assert not parked(db, "ghost")
    second = add.delay(1, 1)
    assert status(db, second.id) == "PENDING"

    # The notification names the row and carries nothing else: not its arguments, not a state.
    (payload,) = notes(listening)
    assert payload == f'["{sent.id}"]'
    assert handed_ids(payload) == [sent.id]
    (claimed,) = app.broker.claim_handed("ghost", [sent.id], ["celery"], 7.0)
    assert (claimed.id, claimed.attempt, claimed.priority) == (sent.id, 1, 4)
    row = task_row(db, sent.id)
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", "ghost", 1)
    lease = one(db, "SELECT lease_until - now() AS left FROM tasks WHERE id = %s", (sent.id,))
    assert 6.0 < lease["left"].total_seconds() <= 7.0
    # Claimed once: a second look finds nothing to claim.
    assert app.broker.claim_handed("ghost", [sent.id], ["celery"], 7.0) == []


def test_a_large_row_is_named_the_same_way(
    app: Celery, db: psycopg.Connection[Any], listening: psycopg.Connection[Any]
) -> None:
    park_ghost(app)
    sent = app.send_task("handoff.big", args=["x" * 10_000])
    (payload,) = notes(listening)
    assert handed_ids(payload) == [sent.id]
    (row,) = app.broker.claim_handed("ghost", [sent.id], ["celery"], 30.0)
    assert row.id == sent.id and row.attempt == 1 and "x" * 10_000 in (row.payload or "")


def test_the_claim_of_a_handed_row_decides_limits_like_any_claim(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    """A notification may name any row: the worker's claim of it still leaves a row of a task
    it rate-limits to its usual claims, holds a row to its concurrency limit, and takes only
    rows of its queues."""
    rated = app.send_task("handoff.rated")
    assert (
        app.broker.claim_handed("w", [rated.id], ["celery"], 30.0, rates={"handoff.rated": 60})
        == []
    )
    assert status(db, rated.id) == "PENDING"
    limit = {"concurrency_key": "k", "concurrency_limit": 1}
    first, second = (app.send_task("handoff.limited", headers=limit) for _ in range(2))
    elsewhere = app.send_task("handoff.any", queue="other")
    claimed = app.broker.claim_handed("w", [first.id, second.id, elsewhere.id], ["celery"], 30.0)
    assert [row.id for row in claimed] == [first.id]
    assert (status(db, second.id), status(db, elsewhere.id)) == ("BLOCKED", "PENDING")


@pytest.mark.parametrize(
    ("case", "park", "send"),
    [
        ("eta in the future", {}, {"countdown": 60}),
        ("expired", {}, {"expires": -1}),
        ("another queue", {}, {"queue": "other"}),
        ("rate-limited there", {"skip_names": ["handoff.any"]}, {}),
        ("concurrency limit", {}, {"headers": {"concurrency_key": "k", "concurrency_limit": 1}}),
        ("park ran out", {"seconds": -1.0}, {}),
    ],
)
def test_tasks_that_cannot_start_now_are_never_handed_off(
    app: Celery,
    db: psycopg.Connection[Any],
    listening: psycopg.Connection[Any],
    case: str,
    park: dict[str, Any],
    send: dict[str, Any],
) -> None:
    park_ghost(app, **park)
    sent = app.send_task("handoff.any", **send)
    assert status(db, sent.id) in ("PENDING", "BLOCKED"), case
    assert notes(listening) == [], case


def test_no_hand_off_inside_a_transaction_or_in_bulk(
    app: Celery, db: psycopg.Connection[Any], listening: psycopg.Connection[Any]
) -> None:
    @app.task(name="handoff.any")
    def anything() -> None:
        pass

    park_ghost(app)
    with app.broker.connection() as conn, conn.transaction():
        inside = anything.apply_async(connection=conn)
    bulk = anything.apply_many([((), {}), ((), {})])
    for task_id in [inside.id, *(r.id for r in bulk)]:
        assert status(db, task_id) == "PENDING"
    assert parked(db, "ghost")


@pytest.fixture
def commit_modes(app: Celery, db: psycopg.Connection[Any]) -> Callable[[], dict[str, Row]]:
    """Record, for every row inserted into tasks, the synchronous_commit its transaction
    commits with and the WAL position of the insert; returns a reader of those records."""
    read_all = note_inserts(
        db,
        app.broker.schema,
        "commit_modes",
        {
            "mode": ("text", "current_setting('synchronous_commit')"),
            "at": ("pg_lsn", "pg_current_wal_insert_lsn()"),
        },
    )

    def read() -> dict[str, Row]:
        return {row["task_id"]: row for row in read_all()}

    return read


def test_a_handed_off_row_commits_before_the_flush_and_the_enqueue_returns_after_it(
    app: Celery,
    db: psycopg.Connection[Any],
    listening: psycopg.Connection[Any],
    commit_modes: Callable[[], dict[str, Row]],
) -> None:
    """A hand-off commits without waiting for the disk, so that its worker hears of it and
    starts the task at once; the enqueue still returns only once the row is on disk."""
    default = one(db, "SELECT current_setting('synchronous_commit') AS mode")["mode"]
    assert default != "off"  # otherwise nothing here could tell the two apart
    park_ghost(app)
    handed = app.send_task("handoff.any")
    assert on_disk(db, commit_modes()[handed.id]["at"])
    plain = app.send_task("handoff.any")  # the park is used up: no hand-off
    modes = {task_id: row["mode"] for task_id, row in commit_modes().items()}
    assert modes == {handed.id: "off", plain.id: default}
    (payload,) = notes(listening)
    assert handed_ids(payload) == [handed.id]


def on_disk(db: psycopg.Connection[Any], lsn: Any) -> bool:
    """Whether the WAL is flushed up to ``lsn``."""
    return bool(one(db, "SELECT pg_current_wal_flush_lsn() >= %s AS done", (lsn,))["done"])


def test_an_async_hand_off_also_returns_once_its_row_is_on_disk(
    app: Celery,
    db: psycopg.Connection[Any],
    listening: psycopg.Connection[Any],
    commit_modes: Callable[[], dict[str, Row]],
) -> None:
    @app.task(name="handoff.async")
    def anything() -> None:
        pass

    flushed: dict[str, bool] = {}

    async def main() -> tuple[str, str]:
        try:
            park_ghost(app)
            handed = await anything.delay_async()
            # Read as soon as the enqueue returns, before anything else could flush the WAL.
            flushed[handed.id] = on_disk(db, commit_modes()[handed.id]["at"])
            plain = await anything.delay_async()
            return handed.id, plain.id
        finally:
            await app.close_async()

    handed, plain = asyncio.run(main())
    assert flushed == {handed: True}
    modes = {task_id: row["mode"] for task_id, row in commit_modes().items()}
    assert modes[handed] == "off" and modes[plain] != "off"
    (payload,) = notes(listening)
    assert handed_ids(payload) == [handed]


@pytest.fixture
def no_flush_right(pg_dsn: str) -> Iterator[tuple[str, str]]:
    """A database of its own where EXECUTE on pg_logical_emit_message (which flush_commit
    needs) is revoked from PUBLIC, as an administrator may do, migrated to a schema
    ``pgtasks``; with a producer role there: (its DSN as the superuser, the role)."""
    suffix = uuid.uuid4().hex[:10]
    name, role = f"pgt_noflush_{suffix}", f"pgt_noflush_{suffix}"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    dsn = make_conninfo(pg_dsn, dbname=name)
    try:
        with psycopg.connect(dsn, autocommit=True) as conn:
            conn.execute(
                """
                DO $$
                DECLARE f regprocedure;
                BEGIN
                    FOR f IN SELECT oid::regprocedure FROM pg_catalog.pg_proc
                              WHERE proname = 'pg_logical_emit_message' LOOP
                        EXECUTE format('REVOKE EXECUTE ON FUNCTION %s FROM PUBLIC', f);
                    END LOOP;
                END $$
                """
            )
        migrate(dsn, "pgtasks")
        grants.apply(dsn, "pgtasks", grants.Roles(producers=[role]))
        yield dsn, role
    finally:
        with psycopg.connect(pg_dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


def test_a_role_that_cannot_wait_for_the_flush_hands_off_with_a_durable_commit(
    no_flush_right: tuple[str, str],
) -> None:
    """Where EXECUTE on pg_logical_emit_message was revoked, flush_commit would fail: the
    hand-off then commits the way the session says, and the enqueue succeeds."""
    dsn, role = no_flush_right
    with psycopg.connect(dsn, autocommit=True) as db:
        db.execute("SET search_path TO pgtasks")
        read_modes = note_inserts(
            db,
            "pgtasks",
            "commit_modes",
            {"mode": ("text", "current_setting('synchronous_commit')")},
        )
        db.execute(sql.SQL("GRANT INSERT ON commit_modes TO {}").format(sql.Identifier(role)))
        db.execute(
            sql.SQL("GRANT USAGE ON SEQUENCE commit_modes_seq_seq TO {}").format(
                sql.Identifier(role)
            )
        )
        db.execute(sql.SQL("LISTEN {}").format(sql.Identifier(handoff_channel("pgtasks", "ghost"))))
        owner = Celery("tests", broker=dsn, schema_name="pgtasks")
        producer = Celery("tests", broker=make_conninfo(dsn, user=role), schema_name="pgtasks")
        try:
            park_ghost(owner)
            handed = producer.send_task("handoff.any")
        finally:
            producer.close()
            owner.close()
        assert handed_ids(notes(db)[0]) == [handed.id]
        assert status(db, handed.id) == "PENDING"
        (noted,) = read_modes()
        assert noted["task_id"] == handed.id and noted["mode"] != "off"


def test_an_idle_worker_claims_only_the_row_it_was_handed(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="handoff.echo")
    def echo(value: Any) -> Any:
        return value

    with worker_factory(concurrency=1) as worker:
        claimed: list[str] = []
        claim_all = app.broker.claim_all

        def spy(*args: Any, **kwargs: Any) -> Any:
            found = claim_all(*args, **kwargs)
            claimed.extend(row.id for row in found)
            return found

        app.broker.claim_all = spy  # type: ignore[method-assign]
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        small = echo.delay({"n": 1})
        assert small.get(timeout=10) == {"n": 1}
        wait_until(lambda: parked(db, worker.id), what="the worker to park again")
        big = echo.delay("y" * 20_000)
        assert big.get(timeout=10) == "y" * 20_000
    assert small.id not in claimed and big.id not in claimed
    for sent in (small, big):
        assert [(a, o) for a, _, o in attempts(db, sent.id)] == [(1, "completed")]
    # Stopped: no longer parked.
    assert not parked(db, worker.id)


def test_a_worker_whose_listener_connects_late_parks_without_waiting_for_a_poll(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """The worker's first claim can find nothing before its listener is connected, when it
    cannot park yet: the listener's connection wakes the loop, which parks then."""
    listen_connection = app.broker.listen_connection

    def slow(*channels: str) -> psycopg.Connection[Any]:
        time.sleep(0.5)
        return listen_connection(*channels)

    app.broker.listen_connection = slow  # type: ignore[method-assign]
    with worker_factory(concurrency=1, poll_interval=30.0) as worker:
        wait_until(lambda: parked(db, worker.id), timeout=10.0, what="the worker to park")


def test_a_worker_with_no_slot_left_claims_when_its_handed_task_ends(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """A claim sent while the handed task starts would find nothing (the worker parked because
    nothing was due) and only slow the start: a worker whose one slot it took claims when
    the task ends, and parks again then."""
    started, release = threading.Event(), threading.Event()

    @app.task(name="handoff.hold")
    def hold() -> None:
        started.set()
        release.wait(10)

    @app.task(name="handoff.quick")
    def quick() -> int:
        return 1

    claims: list[int] = []
    claim_all = app.broker.claim_all

    def spy(*args: Any, **kwargs: Any) -> Any:
        claims.append(1)
        return claim_all(*args, **kwargs)

    app.broker.claim_all = spy  # type: ignore[method-assign]
    # Polls far apart, so that every claim below is one the worker was woken for.
    with worker_factory(concurrency=1, poll_interval=30.0) as worker:
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        # One run first: the worker then knows how long its tasks take and prefetches.
        assert quick.delay().get(timeout=10) == 1
        wait_until(lambda: parked(db, worker.id), what="the worker to park again")
        before = len(claims)
        held = hold.delay()
        assert started.wait(10)
        assert not release.wait(0.3)
        assert len(claims) == before
        release.set()
        held.get(timeout=10)
        wait_until(lambda: len(claims) > before, what="a claim once the task ended")
        wait_until(lambda: parked(db, worker.id), what="the worker to park after it")


def test_a_task_handed_to_a_dead_worker_runs_at_once_elsewhere(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="handoff.once")
    def once() -> str:
        return "ran"

    # A worker that parked and was killed: the enqueue hands it the task, nobody hears. The
    # row waits, PENDING, for the next claim.
    park_ghost(app, lease=1.0)
    sent = once.delay()
    assert not parked(db, "ghost")
    assert status(db, sent.id) == "PENDING"
    with worker_factory():
        assert sent.get(timeout=20) == "ran"
    assert [(a, o) for a, _, o in attempts(db, sent.id)] == [(1, "completed")]


def held_unknowingly(db: psycopg.Connection[Any], worker: str, task_id: str) -> None:
    """Write a waiting row RUNNING for ``worker`` (attempt 1, a minute's lease) behind its
    back, as a hand-off or a claim whose answer it has not read would have left it."""
    db.execute(
        "UPDATE tasks SET status = 'RUNNING', claimed_by = %s, attempt = 1, run_at = now(),"
        " lease_until = now() + interval '1 minute' WHERE id = %s",
        (worker, task_id),
    )


def test_a_worker_whose_listener_broke_finds_what_it_holds_unknowingly(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    ran = threading.Event()

    @app.task(name="handoff.missed")
    def missed() -> str:
        ran.set()
        return "found"

    with worker_factory(concurrency=1) as worker:
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        # A row this worker holds but does not know of (written here by hand, as a claim
        # whose answer never came back would have left it).
        sent = missed.apply_async(countdown=3600)
        held_unknowingly(db, worker.id, sent.id)
        # Then the listening connection breaks: once back, the worker looks for such rows.
        break_listener(db, app, worker.id)
        assert sent.get(timeout=10) == "found"
    assert ran.is_set()
    assert [(a, o) for a, _, o in attempts(db, sent.id)] == [(1, "completed")]


def break_listener(db: psycopg.Connection[Any], app: Celery, worker: str) -> None:
    """Terminate ``worker``'s listening connection (it reconnects by itself)."""
    channel = handoff_channel(app.broker.schema, worker)
    listener = one(
        db, "SELECT pid FROM pg_stat_activity WHERE query = %s", (f'LISTEN "{channel}"',)
    )
    db.execute("SELECT pg_terminate_backend(%s)", (listener["pid"],))


def test_a_row_both_claimed_and_adopted_runs_once(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    runs: list[int] = []

    @app.task(name="handoff.twice")
    def twice() -> None:
        runs.append(1)

    @app.task(name="handoff.then")
    def then() -> None:
        pass

    # A claim of this worker that has committed, its answer not yet read ...
    committed, answer = threading.Event(), threading.Event()
    claim_all = app.broker.claim_all

    def late(*args: Any, **kwargs: Any) -> Any:
        found = claim_all(*args, **kwargs)
        if any(row.name == "handoff.twice" for row in found):
            committed.set()
            answer.wait(10)
        return found

    app.broker.claim_all = late  # type: ignore[method-assign]
    with capture_logs() as logs, worker_factory(concurrency=1) as worker:
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        (sent,) = twice.apply_many([((), {})])  # claimed, never handed off
        assert committed.wait(10)
        # ... is found meanwhile by an adoption after the listener reconnected, and starts.
        break_listener(db, app, worker.id)
        wait_until(
            lambda: any(e["event"] == "worker.adopted" and sent.id in e["tasks"] for e in logs),
            what="the adoption",
        )
        wait_until(lambda: status(db, sent.id) == "COMPLETED", what="the task to run")
        # Then the claim's answer arrives: the same attempt is not started again. The next
        # task's claim comes after that answer, and one slot runs jobs in order: once it has
        # run, a second start of the first would have run too.
        answer.set()
        (following,) = then.apply_many([((), {})])
        wait_until(lambda: status(db, following.id) == "COMPLETED", what="the next task")
    assert runs == [1]
    assert [(a, o) for a, _, o in attempts(db, sent.id)] == [(1, "completed")]


def test_a_stopping_worker_leaves_what_it_was_handed_waiting(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="handoff.late")
    def late() -> None:
        raise AssertionError("a stopping worker runs nothing new")

    worker = Worker(app, pool="threads", concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.ready.wait(30)
    wait_until(lambda: parked(db, worker.id), what="the worker to park")
    # A hand-off whose notification has not been heard when the stop begins: the row waits
    # for any worker's claim.
    worker.listener.on_handoff = None
    sent = late.delay()
    assert not parked(db, worker.id)
    worker.stop()
    thread.join(30)
    row = task_row(db, sent.id)
    assert (row["status"], row["claimed_by"]) == ("PENDING", None)
    assert not parked(db, worker.id)


def test_parks_given_up_unused_back_off(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="handoff.batch")
    def batch() -> None:
        pass

    parks: list[float] = []
    park = app.broker.park

    def counting(*args: Any, **kwargs: Any) -> None:
        parks.append(0.0)
        park(*args, **kwargs)

    app.broker.park = counting  # type: ignore[method-assign]
    with worker_factory(concurrency=1) as worker:
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        # Bulk enqueues are claimed, never handed off: each one would cost a park and an
        # unpark without the back-off.
        rounds = 40
        for _ in range(rounds):
            sent = batch.apply_many([((), {})] * 3)
            wait_until(
                lambda sent=sent: all(status(db, r.id) == "COMPLETED" for r in sent),
                what="the batch to finish",
            )
        assert len(parks) < rounds * 3 // 4, parks
        assert worker.park_backoff > 0.0
        # Idle again, it parks within a second, and the next delay is handed to it.
        wait_until(lambda: parked(db, worker.id), what="the worker to park again")
        assert batch.delay().get(timeout=10) is None
        assert worker.park_backoff == 0.0


@pytest.mark.parametrize("concurrency", [1, 2])
def test_a_handed_task_starts_on_the_thread_that_heard_it_while_the_other_listens(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, concurrency: int
) -> None:
    """No pool thread to wake before a handed-off task starts: it runs on the listener's
    thread that heard of it, and the listener's other thread listens meanwhile (a revoke is
    heard at once, not at the next lease renewal; a second hand-off goes to the pool)."""
    release = threading.Event()
    started: list[tuple[str, str]] = []
    both = threading.Semaphore(0)

    @app.task(name="handoff.where", bind=True)
    def where(self: Any) -> None:
        started.append((self.request.id, threading.current_thread().name))
        both.release()
        release.wait(10)

    # Lease renewals 20 s apart: within the test, only a notification reports the revoke.
    with (
        capture_logs() as logs,
        worker_factory(concurrency=concurrency, lease=60.0, poll_interval=30.0) as worker,
    ):
        wait_until(lambda: parked(db, worker.id), what="the worker to park")
        first = where.delay()
        assert both.acquire(timeout=10)
        # Either of the listener's two threads, whichever had the turn.
        assert started[0][0] == first.id
        assert started[0][1].startswith("pgtasks-listener")
        if concurrency == 2:
            # The worker has a slot left, and parks again for it.
            wait_until(lambda: parked(db, worker.id), what="the worker to park again")
            second = where.delay()
            assert both.acquire(timeout=10)
            assert task_row(db, second.id)["claimed_by"] == worker.id
            # Heard by the relief thread while the first task holds the other: run by the pool.
            assert started[1] == (second.id, "pgtasks-task-0")
        first.revoke()
        wait_until(
            lambda: any(
                e["event"] == "task.cancel_requested"
                and e.get("task_id") == first.id
                and e.get("via") == "notify"
                for e in logs
            ),
            timeout=5.0,
            what="the revoke to be heard",
        )
        release.set()
        wait_until(lambda: status(db, first.id) != "RUNNING", what="the task to end")
    assert len(started) == concurrency


def test_a_warm_stop_waits_for_a_task_running_on_the_listeners_thread(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    started, release = threading.Event(), threading.Event()
    ran_on: list[str] = []

    @app.task(name="handoff.finish")
    def finish() -> int:
        ran_on.append(threading.current_thread().name)
        started.set()
        release.wait(10)
        return 7

    worker = Worker(app, pool="threads", concurrency=1)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    assert worker.ready.wait(30)
    wait_until(lambda: parked(db, worker.id), what="the worker to park")
    sent = finish.delay()
    assert started.wait(10)
    assert ran_on[0].startswith("pgtasks-listener")
    worker.stop()
    # The stop waits for the task, wherever it runs.
    thread.join(0.5)
    assert thread.is_alive()
    release.set()
    thread.join(30)
    assert not thread.is_alive()
    assert status(db, sent.id) == "COMPLETED"
    assert sent.get(timeout=10) == 7
