"""Leases and fencing: expiry and reclaim, renewal, stale owners, and cancellation.

Tests act as a stale worker by calling the broker's fenced writes directly with an old
(worker, attempt) token.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from datetime import timedelta
from typing import Any

import psycopg
import pytest
from psycopg import sql
from structlog.testing import capture_logs

from pgtasks import Celery
from pgtasks.broker import Broker
from pgtasks.exceptions import TaskRevokedError
from pgtasks.records import Failure, Release, RetryAt, Success
from pgtasks.serialization import encode
from pgtasks.worker import Worker
from tests.apps.harness import (
    attempts,
    db_clock_past,
    expire_lease,
    one,
    rows,
    status,
    task_row,
    wait_until,
)

WorkerFactory = Callable[..., AbstractContextManager[Worker]]
Write = Callable[[Broker, str, str, int], dict[str, Any]]
JSON = "application/json"


def _complete(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    value = encode(f"written by {worker}", "json").data
    return broker.complete(worker, [Success(task_id, attempt, True, JSON, value, None)])


def _fail(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    error = encode({"exc_type": "ValueError", "exc_message": ["late"]}, "json").data
    item = Failure(
        task_id, attempt, "FAILED", "ValueError: late", "Traceback", True, JSON, error, None
    )
    return broker.fail(worker, [item])


def _dead(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    item = Failure(task_id, attempt, "DEAD", "poison", None, False, JSON, None, None)
    return broker.fail(worker, [item])


def _retry(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    item = RetryAt(task_id, attempt, 1, 0.0, None, "OSError: late", None, "retry", None)
    return broker.retry(worker, [item])


def _release(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    return broker.release(worker, [Release(task_id, attempt, 0.0, None)])


def _renew(broker: Broker, worker: str, task_id: str, attempt: int) -> dict[str, Any]:
    return broker.renew(worker, [(task_id, attempt)], 30.0)


WRITES: dict[str, Write] = {
    "complete": _complete,
    "fail": _fail,
    "dead": _dead,
    "retry": _retry,
    "release": _release,
    "renew": _renew,
}


def snapshot(db: psycopg.Connection[Any], task_id: str) -> tuple[Any, ...]:
    """Everything the database holds about a task."""
    return (
        task_row(db, task_id),
        attempts(db, task_id),
        rows(db, "SELECT * FROM results WHERE task_id = %s", (task_id,)),
    )


@pytest.fixture
def noop(app: Celery) -> Any:
    @app.task
    def noop() -> None:
        """Never runs here: tests claim and write directly."""

    return noop


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    """Holds in-process tasks until the test sets it."""
    event = threading.Event()
    yield event
    event.set()


# -- expiry and reclaim --------------------------------------------------------------------------


def test_expired_lease_is_reclaimed_and_claimable_again(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    r = noop.delay()
    [first] = app.broker.claim("old-owner", ["celery"], 1, 30.0)
    assert first.attempt == 1
    assert app.broker.reclaim(3) == [], "a live lease was reclaimed"
    assert app.broker.claim("new-owner", ["celery"], 1, 30.0) == []

    expire_lease(db, r.id)
    reclaimed = app.broker.reclaim(3)
    assert [(x["id"], x["status"], x["previous_owner"]) for x in reclaimed] == [
        (r.id, "PENDING", "old-owner")
    ]
    row = task_row(db, r.id)
    assert (row["status"], row["claimed_by"], row["lease_until"]) == ("PENDING", None, None)
    assert "old-owner" in row["error"]
    assert attempts(db, r.id) == [(1, "old-owner", "lost")]
    assert app.broker.reclaim(3) == []

    [second] = app.broker.claim("new-owner", ["celery"], 1, 30.0)
    assert (second.id, second.attempt) == (r.id, 2)
    row = task_row(db, r.id)
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", "new-owner", 2)


def test_worker_maintenance_reclaims_an_abandoned_task(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task
    def echo(x: str) -> str:
        return x

    r = echo.delay("hello")
    [claimed] = app.broker.claim("crashed-worker", ["celery"], 1, 30.0)
    expire_lease(db, claimed.id)
    with worker_factory() as worker:
        assert r.get(timeout=15) == "hello"
    assert attempts(db, r.id) == [(1, "crashed-worker", "lost"), (2, worker.id, "completed")]
    assert task_row(db, r.id)["attempt"] == 2


def test_running_task_keeps_its_lease_past_the_lease_time(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, gate: threading.Event
) -> None:
    @app.task
    def hold() -> str:
        assert gate.wait(15)
        return "held"

    with worker_factory(lease=1.0) as worker:
        r = hold.delay()
        first = wait_until(
            lambda: (row := task_row(db, r.id))["status"] == "RUNNING" and row,
            what="the task to start",
        )
        # Past the first lease: still the same owner and attempt, with a later lease.
        wait_until(
            lambda: db_clock_past(db, first["lease_until"], 0.5),
            what="the first lease to run out",
        )
        row = task_row(db, r.id)
        assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", worker.id, 1)
        assert row["lease_until"] > first["lease_until"]
        assert app.broker.reclaim(3) == []
        gate.set()
        assert r.get(timeout=10) == "held"
    assert attempts(db, r.id) == [(1, worker.id, "completed")]


def test_task_whose_leases_keep_expiring_is_dead_lettered(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    r = noop.delay()
    max_lost = app.settings.max_lost_attempts
    assert max_lost == 3
    for n in range(1, max_lost + 1):
        [claimed] = app.broker.claim(f"doomed-{n}", ["celery"], 1, 30.0)
        assert claimed.attempt == n
        expire_lease(db, r.id)
        [reclaimed] = app.broker.reclaim(max_lost)
        expected = "DEAD" if n == max_lost else "PENDING"
        assert (reclaimed["status"], reclaimed["previous_owner"]) == (expected, f"doomed-{n}")

    assert app.broker.claim("doomed-4", ["celery"], 1, 30.0) == []
    row = task_row(db, r.id)
    assert row["status"] == "DEAD"
    assert row["error"].startswith("worker lost")
    assert row["payload"] == [[], {}]
    assert attempts(db, r.id) == [(n, f"doomed-{n}", "lost") for n in range(1, max_lost + 1)]
    assert r.state == "FAILURE"


# -- stale owners ---------------------------------------------------------------------------------


def test_stale_owner_writes_change_nothing(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    r = noop.delay()
    [old] = app.broker.claim("old-owner", ["celery"], 1, 30.0)
    expire_lease(db, r.id)
    assert len(app.broker.reclaim(3)) == 1
    # Back in the queue, not yet taken: the old owner cannot finish, retry or renew it either.
    waiting = snapshot(db, r.id)
    for name, write in WRITES.items():
        assert write(app.broker, "old-owner", r.id, old.attempt) == {}, f"stale {name} was applied"
    assert snapshot(db, r.id) == waiting
    [new] = app.broker.claim("new-owner", ["celery"], 1, 30.0)
    assert (old.attempt, new.attempt) == (1, 2)

    before = snapshot(db, r.id)
    # The old token, the old owner with the new attempt, the new owner with the old attempt.
    tokens = [("old-owner", old.attempt), ("old-owner", new.attempt), ("new-owner", old.attempt)]
    for worker, attempt in tokens:
        for name, write in WRITES.items():
            assert write(app.broker, worker, r.id, attempt) == {}, f"stale {name} was applied"
    assert snapshot(db, r.id) == before

    assert _complete(app.broker, "new-owner", r.id, new.attempt) == {r.id: "COMPLETED"}
    done = snapshot(db, r.id)
    for worker, attempt in tokens:
        for name, write in WRITES.items():
            assert write(app.broker, worker, r.id, attempt) == {}, f"stale {name} was applied"
    assert snapshot(db, r.id) == done
    assert r.get(timeout=5) == "written by new-owner"
    assert attempts(db, r.id) == [(1, "old-owner", "lost"), (2, "new-owner", "completed")]


def test_a_renewal_never_waits_for_a_row_another_transaction_holds(
    app: Celery, pg_dsn: str, schema: str, db: psycopg.Connection[Any], noop: Any
) -> None:
    """A row held by another transaction (as by its worker's own completion) is answered still
    owned and left as it is; the other rows are renewed. Since a renewal never waits, an
    outcome write that locks its rows in any order cannot deadlock with it."""
    ids = [noop.delay().id for _ in range(3)]
    claimed = {c.id: c for c in app.broker.claim("w1", ["celery"], 3, 5.0)}
    owned = [(i, claimed[i].attempt) for i in ids]
    before = {i: task_row(db, i)["lease_until"] for i in ids}
    with psycopg.connect(pg_dsn, autocommit=False) as holder:
        holder.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (ids[1],))
        pool = ThreadPoolExecutor(1)
        try:
            # Answered while the lock is held: it never waited for it.
            renewed = pool.submit(app.broker.renew, "w1", owned, 60.0).result(timeout=10)
        finally:
            # Should it wait, the lock goes with the holder's connection and the thread ends.
            pool.shutdown(wait=False)
        assert renewed == {ids[0]: False, ids[1]: False, ids[2]: False}
        after = {i: task_row(db, i)["lease_until"] for i in ids}
        assert after[ids[1]] == before[ids[1]]
        assert after[ids[0]] > before[ids[0]] and after[ids[2]] > before[ids[2]]
        # The holder completes the row meanwhile: the next renewal finds it gone.
        holder.execute(
            "UPDATE tasks SET status = 'COMPLETED', claimed_by = NULL, lease_until = NULL"
            " WHERE id = %s",
            (ids[1],),
        )
        holder.commit()
    assert app.broker.renew("w1", owned, 60.0) == {ids[0]: False, ids[2]: False}
    # A revoke reaches the renewal's answer as before.
    app.broker.revoke(ids[2])
    assert app.broker.renew("w1", owned, 60.0) == {ids[0]: False, ids[2]: True}


#: One outcome write per kind, for a batch of claimed rows, and the status each row gets.
OUTCOMES: dict[str, tuple[Callable[[Broker, list[Any]], dict[str, str]], str]] = {
    "complete": (
        lambda b, cs: b.complete(
            "w1", [Success(c.id, c.attempt, False, JSON, None, None) for c in cs]
        ),
        "COMPLETED",
    ),
    "fail": (
        lambda b, cs: b.fail(
            "w1",
            [Failure(c.id, c.attempt, "FAILED", "E", None, False, JSON, None, None) for c in cs],
        ),
        "FAILED",
    ),
    "retry": (
        lambda b, cs: b.retry(
            "w1",
            [RetryAt(c.id, c.attempt, 1, 60.0, None, "E", None, "retry", None) for c in cs],
        ),
        "PENDING",
    ),
    "release": (
        lambda b, cs: b.release("w1", [Release(c.id, c.attempt, 60.0, None) for c in cs]),
        "PENDING",
    ),
}


@pytest.mark.parametrize("kind", list(OUTCOMES))
def test_renewals_and_outcomes_of_one_worker_never_deadlock(
    app: Celery, pg_dsn: str, schema: str, db: psycopg.Connection[Any], noop: Any, kind: str
) -> None:
    """Renewals of every row a worker holds, over and over beside outcome writes of those rows
    in batches (largest id first, the opposite of an id-ordered pass): every outcome is written
    once, and no statement fails. Outcome writes lock their rows in the order they come, and
    only the renewals' skipping of locked rows keeps the two from waiting on each other."""
    write, expected = OUTCOMES[kind]
    ids = [noop.delay().id for _ in range(200)]
    claimed = app.broker.claim("w1", ["celery"], 200, 60.0)
    assert len(claimed) == 200
    owned = [(c.id, c.attempt) for c in claimed]
    stop = threading.Event()
    errors: list[BaseException] = []
    renewals = [0]

    def renew() -> None:
        broker = Broker(pg_dsn, schema)
        try:
            while not stop.is_set():
                broker.renew("w1", owned, 60.0)
                renewals[0] += 1
        except BaseException as exc:
            errors.append(exc)
        finally:
            broker.close()

    renewer = threading.Thread(target=renew)
    renewer.start()
    try:
        wait_until(lambda: renewals[0] > 0 or bool(errors), what="the renewals to start")
        order = sorted(claimed, key=lambda c: c.id, reverse=True)
        written: dict[str, str] = {}
        for start in range(0, len(order), 20):
            written.update(write(app.broker, order[start : start + 20]))
    finally:
        stop.set()
        renewer.join(timeout=30)
    assert not errors, errors
    assert written == dict.fromkeys(ids, expected)
    found = rows(db, "SELECT status, claimed_by FROM tasks WHERE id = ANY(%s)", (ids,))
    assert {(r["status"], r["claimed_by"]) for r in found} == {(expected, None)}


def test_history_keeps_every_run_end_when_an_attempt_number_repeats(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    # The history is a log with no unique key: a row whose attempt was set back by hand runs
    # under a number the history holds already, and both ends are recorded.
    r = noop.delay()
    [first] = app.broker.claim("first-owner", ["celery"], 1, 30.0)
    expire_lease(db, r.id)
    assert len(app.broker.reclaim(3)) == 1
    db.execute("UPDATE tasks SET attempt = 0 WHERE id = %s", (r.id,))
    [second] = app.broker.claim("second-owner", ["celery"], 1, 30.0)
    assert first.attempt == second.attempt == 1
    assert _complete(app.broker, "second-owner", r.id, 1) == {r.id: "COMPLETED"}
    assert attempts(db, r.id) == [(1, "first-owner", "lost"), (1, "second-owner", "completed")]
    history = app.broker.task_detail(r.id)
    assert history is not None
    assert [a["outcome"] for a in history["attempts"]] == ["lost", "completed"]


def test_worker_discards_its_outcome_after_losing_the_lease(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, gate: threading.Event
) -> None:
    started = threading.Event()

    @app.task
    def hold() -> str:
        started.set()
        assert gate.wait(15)
        return "written by the stale worker"

    # A long lease keeps the worker's own renewals and reclaims out of the way; one slot keeps it
    # from claiming the row back itself.
    with worker_factory(concurrency=1, lease=30.0) as worker:
        r = hold.delay()
        # Running, not only claimed: a lease lost before the start drops the call unrun.
        assert started.wait(10), "the task did not start"
        expire_lease(db, r.id)
        [reclaimed] = app.broker.reclaim(3)
        assert reclaimed["previous_owner"] == worker.id
        [thief] = app.broker.claim("thief", ["celery"], 1, 30.0)
        assert thief.attempt == 2

        gate.set()
        wait_until(lambda: worker.processed >= 1, what="the worker to write its outcome")
        row = task_row(db, r.id)
        assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", "thief", 2)
        assert r.state == "STARTED"
        assert rows(db, "SELECT * FROM results WHERE task_id = %s", (r.id,)) == []

        assert _complete(app.broker, "thief", r.id, 2) == {r.id: "COMPLETED"}
        assert r.get(timeout=5) == "written by thief"
    assert attempts(db, r.id) == [(1, worker.id, "lost"), (2, "thief", "completed")]


def test_a_prefetched_task_whose_lease_was_lost_is_not_started(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, gate: threading.Event
) -> None:
    ran: list[str] = []

    @app.task(name="leases.queued")
    def queued(n: str) -> None:
        ran.append(n)
        if n == "first":
            assert gate.wait(15)

    # One slot and one prefetched row: "first" runs and holds the slot, "second" waits in the
    # worker, claimed.
    first = queued.apply_async(("first",), priority=9)
    second = queued.apply_async(("second",))
    with capture_logs() as logs, worker_factory(concurrency=1, prefetch_multiplier=2) as worker:
        wait_until(lambda: ran == ["first"], what="the first task to start")
        wait_until(lambda: status(db, second.id) == "RUNNING", what="the second to be claimed")
        # Its lease runs out meanwhile and another worker takes it.
        expire_lease(db, second.id)
        [reclaimed] = app.broker.reclaim(3)
        assert reclaimed["previous_owner"] == worker.id
        [thief] = app.broker.claim("thief", ["celery"], 1, 30.0)
        assert (thief.id, thief.attempt) == (second.id, 2)
        wait_until(
            lambda: [e["task_id"] for e in list(logs) if e["event"] == "lease.lost"] == [second.id],
            what="the worker's renewal to find the lease lost",
        )
        gate.set()
        assert first.get(timeout=10) is None
        wait_until(lambda: worker.held() == [], what="the worker to drop the lost claim")
        assert ran == ["first"]
    row = task_row(db, second.id)
    assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", "thief", 2)
    assert attempts(db, second.id) == [(1, worker.id, "lost")]


# -- cancellation ---------------------------------------------------------------------------------


def test_revoked_pending_task_is_cancelled_and_never_claimed(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    ran: list[str] = []

    @app.task
    def mark(label: str) -> str:
        ran.append(label)
        return label

    doomed = mark.apply_async(("doomed",), priority=9)
    doomed.revoke()
    row = task_row(db, doomed.id)
    assert (row["status"], row["cancel_requested"], row["attempt"]) == ("CANCELLED", True, 0)
    assert doomed.state == "REVOKED"
    assert app.broker.revoke(doomed.id) is None

    # The revoked row outranks the sentinel: had it been claimable it would have run first.
    sentinel = mark.apply_async(("sentinel",), priority=0)
    with worker_factory():
        assert sentinel.get(timeout=10) == "sentinel"
    assert ran == ["sentinel"]
    row = task_row(db, doomed.id)
    assert (row["status"], row["attempt"]) == ("CANCELLED", 0)
    with pytest.raises(TaskRevokedError):
        doomed.get(timeout=1)


def test_revoked_running_task_cannot_record_success(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, gate: threading.Event
) -> None:
    started = threading.Event()

    @app.task
    def hold() -> str:
        started.set()
        assert gate.wait(15)
        return "finished anyway"

    with worker_factory() as worker:
        r = hold.delay()
        # Running, not only claimed: a revoke between the two discards the call unrun.
        assert started.wait(10), "the task did not start"
        assert app.broker.revoke(r.id) == "RUNNING"
        row = task_row(db, r.id)
        assert (row["status"], row["cancel_requested"]) == ("RUNNING", True)
        gate.set()
        wait_until(lambda: status(db, r.id) != "RUNNING", what="the outcome to be written")
    assert status(db, r.id) == "CANCELLED"
    assert r.state == "REVOKED"
    with pytest.raises(TaskRevokedError):
        r.get(timeout=1)
    stored = one(db, "SELECT state, result FROM results WHERE task_id = %s", (r.id,))
    assert (stored["state"], stored["result"]) == ("REVOKED", None)
    assert attempts(db, r.id) == [(1, worker.id, "cancelled")]


def test_revoked_running_task_cannot_retry_back_to_pending(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory, gate: threading.Event
) -> None:
    ran: list[str] = []

    @app.task(bind=True)
    def hold_then_retry(self: Any, label: str) -> str:
        ran.append(label)
        if label == "retrying":
            assert gate.wait(15)
            raise self.retry(countdown=0)
        return label

    with worker_factory():
        r = hold_then_retry.delay("retrying")
        # Running, not only claimed: a revoke between the two discards the call unrun.
        wait_until(lambda: ran == ["retrying"], what="the task to start")
        assert app.broker.revoke(r.id) == "RUNNING"
        gate.set()
        wait_until(lambda: status(db, r.id) != "RUNNING", what="the retry to be written")
        assert status(db, r.id) == "CANCELLED"
        # A later task runs; the cancelled one (due at once, had it been PENDING) does not.
        assert hold_then_retry.delay("after").get(timeout=10) == "after"
    assert ran == ["retrying", "after"]
    assert r.state == "REVOKED"


@pytest.mark.parametrize("write", ["complete", "fail", "dead", "retry", "release", "reclaim"])
def test_revoked_running_task_ends_cancelled_whatever_its_owner_writes(
    app: Celery, db: psycopg.Connection[Any], noop: Any, write: str
) -> None:
    r = noop.delay()
    [claimed] = app.broker.claim("owner", ["celery"], 1, 30.0)
    assert app.broker.revoke(r.id) == "RUNNING"
    # The owner learns of the cancel request with its next renewal.
    assert app.broker.renew("owner", [(r.id, claimed.attempt)], 30.0) == {r.id: True}

    if write == "reclaim":
        expire_lease(db, r.id)
        assert [(x["id"], x["status"]) for x in app.broker.reclaim(3)] == [(r.id, "CANCELLED")]
    else:
        assert WRITES[write](app.broker, "owner", r.id, claimed.attempt) == {r.id: "CANCELLED"}
    assert status(db, r.id) == "CANCELLED"
    assert r.state == "REVOKED"
    assert app.broker.claim("anyone", ["celery"], 10, 30.0) == []


def test_nothing_turns_cancelled_back_to_pending(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    waiting = noop.delay()
    assert app.broker.revoke(waiting.id) == "CANCELLED"
    running = noop.delay()
    [claimed] = app.broker.claim("owner", ["celery"], 1, 30.0)
    assert app.broker.revoke(running.id) == "RUNNING"
    assert _complete(app.broker, "owner", running.id, claimed.attempt) == {running.id: "CANCELLED"}

    for task_id, owner, attempt in [(waiting.id, "owner", 0), (running.id, "owner", 1)]:
        before = snapshot(db, task_id)
        for worker in (owner, "someone-else"):
            for tried in (attempt, attempt + 1):
                for name, write in WRITES.items():
                    assert write(app.broker, worker, task_id, tried) == {}, f"{name} applied"
        assert app.broker.revoke(task_id) is None
        assert app.broker.claim("anyone", ["celery"], 10, 30.0) == []
        # Due long ago and with a lease long expired, it is still neither claimable nor reclaimed.
        db.execute(
            "UPDATE tasks SET run_at = now() - interval '1 hour',"
            " lease_until = now() - interval '1 hour' WHERE id = %s",
            (task_id,),
        )
        assert app.broker.reclaim(3) == []
        assert app.broker.claim("anyone", ["celery"], 10, 30.0) == []
        with pytest.raises(ValueError, match="already exists"):
            noop.apply_async(task_id=task_id)
        after = snapshot(db, task_id)
        assert after[0]["status"] == "CANCELLED"
        assert after[1:] == before[1:]
        moved = ("run_at", "lease_until")
        assert {k: v for k, v in after[0].items() if k not in moved} == {
            k: v for k, v in before[0].items() if k not in moved
        }


# -- completion --------------------------------------------------------------------------------


def test_one_completion_statement_writes_each_outcome_as_it_came(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    """Outcomes leave out what they do not need (no result kept, state SUCCESS): each row of
    one batch still gets its own state, result and start, the start on the database clock."""
    ids = [noop.delay().id for _ in range(4)]
    claimed = {r.id: r for r in app.broker.claim("w1", ["celery"], 4, 30.0)}
    assert sorted(claimed) == sorted(ids)
    kept, unkept, ignored, unstarted = (claimed[i] for i in ids)
    value = encode({"n": 1}, "json").data
    db_now = one(db, "SELECT now() AS now")["now"]
    started = db_now - timedelta(seconds=2.5)
    written = app.broker.complete(
        "w1",
        [
            Success(kept.id, kept.attempt, True, JSON, value, started),
            Success(unkept.id, unkept.attempt, False, JSON, None, started),
            Success(ignored.id, ignored.attempt, True, JSON, None, started, state="IGNORED"),
            Success(unstarted.id, unstarted.attempt, False, JSON, None, None),
        ],
    )
    assert written == dict.fromkeys(ids, "COMPLETED")
    results = {
        r["task_id"]: (r["state"], r["result"] and bytes(r["result"]))
        for r in rows(db, "SELECT task_id, state, result FROM results")
    }
    assert results == {kept.id: ("SUCCESS", value), ignored.id: ("IGNORED", None)}
    history = {
        r["task_id"]: r
        for r in rows(db, "SELECT task_id, outcome, started_at, finished_at FROM attempts")
    }
    assert {i: history[i]["outcome"] for i in ids} == {
        kept.id: "completed",
        unkept.id: "completed",
        ignored.id: "ignored",
        unstarted.id: "completed",
    }
    assert history[unstarted.id]["started_at"] is None
    for task_id in (kept.id, unkept.id, ignored.id):
        ran = history[task_id]["finished_at"] - history[task_id]["started_at"]
        assert timedelta(seconds=2.4) < ran < timedelta(seconds=10)
