"""The operators' queries: queue stats, dead letters (list, requeue, discard), health, and the
dashboard's task views, against real Postgres."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.cli.bench.store import BenchStore
from pgtasks.worker import Worker
from tests.apps.harness import attempts, expire_lease, task_row, wait_until

WorkerFactory = Callable[..., AbstractContextManager[Worker]]


def insert(db: psycopg.Connection[Any], status: str = "PENDING", **columns: Any) -> str:
    """A task row written directly; ``columns`` may hold SQL expressions as ``sql.SQL``."""
    task_id = columns.pop("id", None) or str(uuid.uuid4())
    values: dict[str, Any] = {"id": task_id, "name": "ops.noop", "status": status}
    values.update(payload=psycopg.types.json.Json([[], {}]), **columns)
    if status == "RUNNING":
        values.setdefault("claimed_by", "some-worker")
        values.setdefault("lease_until", sql.SQL("now() + interval '1 minute'"))
    query = sql.SQL("INSERT INTO tasks ({}) VALUES ({})").format(
        sql.SQL(", ").join(sql.Identifier(k) for k in values),
        sql.SQL(", ").join(
            v if isinstance(v, sql.Composable) else sql.Literal(v) for v in values.values()
        ),
    )
    db.execute(query)
    return task_id


def add_attempt(db: psycopg.Connection[Any], task_id: str, attempt: int, outcome: str) -> None:
    db.execute(
        "INSERT INTO attempts (task_id, attempt, worker, outcome) VALUES (%s, %s, 'w', %s)",
        (task_id, attempt, outcome),
    )


def ago(seconds: int) -> sql.Composable:
    return sql.SQL("now() - make_interval(secs => {})").format(sql.Literal(seconds))


def age(db: psycopg.Connection[Any], task_id: str) -> float:
    """Seconds since the row's run_at, on the database clock, now."""
    row = db.execute(
        "SELECT extract(epoch FROM now() - run_at)::float8 FROM tasks WHERE id = %s", (task_id,)
    ).fetchone()
    assert row is not None
    return float(row[0])


def lose_workers(app: Celery, db: psycopg.Connection[Any], task_id: str, times: int) -> list[str]:
    """Claim the task and let its lease expire ``times`` times; the reclaimer's verdicts."""
    verdicts = []
    for n in range(times):
        [claimed] = app.broker.claim(f"doomed-{n}", ["celery"], 1, 30.0)
        assert claimed.id == task_id
        expire_lease(db, task_id)
        [reclaimed] = app.broker.reclaim(app.settings.max_lost_attempts)
        verdicts.append(reclaimed["status"])
    return verdicts


@pytest.fixture
def noop(app: Celery) -> Any:
    @app.task(name="ops.noop")
    def noop() -> str:
        return "done"

    return noop


# -- queue stats and health -----------------------------------------------------------------------


def test_queue_stats(app: Celery, db: psycopg.Connection[Any]) -> None:
    oldest = insert(db, run_at=ago(90))
    insert(db, run_at=ago(10))
    insert(db, run_at=sql.SQL("now() + interval '1 hour'"))
    insert(db, "RUNNING", lease_until=ago(5))
    insert(db, "RUNNING")
    insert(db, "DEAD", run_at=ago(600))  # older, but not waiting
    done = insert(db, "COMPLETED")
    insert(db, "COMPLETED", updated_at=ago(3600))  # outside the window
    for n in (1, 2, 3):
        add_attempt(db, done, n, "completed")
    insert(db, "PENDING", queue="io", run_at=sql.SQL("now() + interval '1 hour'"))

    stats = {r["queue"]: r for r in app.broker.queue_stats(window_seconds=60)}
    assert set(stats) == {"celery", "io"}
    celery = stats["celery"]
    counts = {k: celery[k] for k in ("pending_due", "scheduled", "running", "expired_leases")}
    assert counts == {"pending_due": 2, "scheduled": 1, "running": 2, "expired_leases": 1}
    assert (celery["dead"], celery["completed"], celery["failed"]) == (1, 1, 0)
    # The oldest due row's wait: 90 s when it was written, no more than it is now.
    assert 90 <= celery["oldest_due_age"] <= age(db, oldest)
    assert celery["finished_attempts"] == 3
    assert celery["throughput"] == pytest.approx(3.0)
    io = stats["io"]
    assert (io["pending_due"], io["scheduled"], io["oldest_due_age"]) == (0, 1, None)
    assert [r["queue"] for r in app.broker.queue_stats(queues=["io"])] == ["io"]


def test_health_report(app: Celery, db: psycopg.Connection[Any]) -> None:
    empty = app.broker.health_report()
    assert (empty["oldest_due_age"], empty["expired_leases"], empty["dead_total"]) == (None, 0, 0)
    assert empty["live_workers"] == 0
    oldest = insert(db, run_at=ago(900))
    insert(db, "RUNNING", lease_until=ago(1))
    insert(db, "DEAD")
    insert(db, "DEAD", updated_at=ago(3600), run_at=ago(7200))
    db.execute(
        "INSERT INTO workers (id, host, pid, queues, concurrency)"
        " VALUES ('w1', 'h', 1, '{celery}', 1)"
    )
    report = app.broker.health_report(window_seconds=120, live_within=30)
    assert 900 <= report["oldest_due_age"] <= age(db, oldest)
    assert (report["expired_leases"], report["dead_total"], report["dead_recent"]) == (1, 2, 1)
    assert report["dead_per_minute"] == pytest.approx(0.5)
    assert report["live_workers"] == 1


# -- dead letters ---------------------------------------------------------------------------------


def test_dead_letters_list_and_show(app: Celery, db: psycopg.Connection[Any]) -> None:
    old = insert(db, "DEAD", error="boom", attempt=3, retries=2, updated_at=ago(60))
    new = insert(db, "DEAD", name="ops.other", queue="io", error="bang")
    insert(db, "FAILED")
    add_attempt(db, old, 1, "retry")
    add_attempt(db, old, 3, "dead")

    listed = app.broker.dead_letters(10, 0)
    assert [r["id"] for r in listed] == [new, old]
    assert set(listed[0]) == {"id", "name", "queue", "error", "attempt", "retries", "updated_at"}
    assert [r["id"] for r in app.broker.dead_letters(10, 1)] == [old]
    assert [r["id"] for r in app.broker.dead_letters(10, 0, task_name="ops.other")] == [new]
    assert [r["id"] for r in app.broker.dead_letters(10, 0, queue="celery")] == [old]

    shown = app.broker.dead_letter(old)
    assert shown is not None
    assert (shown["status"], shown["error"], shown["payload"]) == ("DEAD", "boom", "[[], {}]")
    assert [(a["attempt"], a["outcome"]) for a in shown["attempts"]] == [(1, "retry"), (3, "dead")]
    assert app.broker.dead_letter(str(uuid.uuid4())) is None
    failed = app.broker.task_list(state="FAILED")[0]["id"]
    assert app.broker.dead_letter(failed) is None
    assert app.broker.task_detail(failed) is not None


def test_requeue_is_fenced_on_dead(app: Celery, db: psycopg.Connection[Any]) -> None:
    dead = insert(db, "DEAD", attempt=4, retries=3, error="poison")
    taken = insert(db, "DEAD", attempt=2)
    # Someone else changed it first (another operator's requeue, say): no longer DEAD.
    db.execute(
        "UPDATE tasks SET status = 'RUNNING', claimed_by = 'w', lease_until = now(),"
        " attempt = 3 WHERE id = %s",
        (taken,),
    )
    before = task_row(db, taken)

    assert app.broker.requeue_dead([dead, taken, "missing"]) == 1
    assert task_row(db, taken) == before
    row = task_row(db, dead)
    assert (row["status"], row["retries"], row["attempt"], row["requeued_attempt"]) == (
        "PENDING",
        0,
        5,
        5,
    )
    assert attempts(db, dead) == [(5, "operator", "requeued")]
    assert app.broker.requeue_dead([dead]) == 0
    with pytest.raises(ValueError):
        app.broker.requeue_dead()


def test_a_dead_letter_at_the_attempts_top_is_requeued_with_the_others(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    top = insert(db, "DEAD", attempt=2**31 - 1)
    plain = insert(db, "DEAD", attempt=1)
    assert app.broker.requeue_dead([top, plain]) == 2
    after = [task_row(db, i) for i in (top, plain)]
    assert [(r["status"], r["attempt"]) for r in after] == [("PENDING", 2**31 - 1), ("PENDING", 2)]


def test_requeued_task_runs_and_keeps_its_history(
    app: Celery, db: psycopg.Connection[Any], noop: Any, worker_factory: WorkerFactory
) -> None:
    r = noop.delay()
    assert lose_workers(app, db, r.id, 3) == ["PENDING", "PENDING", "DEAD"]
    assert app.AsyncResult(r.id).state == "FAILURE"
    assert app.broker.requeue_dead([r.id], by="ops-test") == 1
    again = app.AsyncResult(r.id)
    assert again.state == "PENDING"
    with worker_factory() as worker:
        assert again.get(timeout=15) == "done"
    lost = [(n, f"doomed-{n - 1}", "lost") for n in (1, 2, 3)]
    assert attempts(db, r.id) == [*lost, (4, "ops-test", "requeued"), (5, worker.id, "completed")]


def test_requeue_gives_a_fresh_lost_worker_budget(
    app: Celery, db: psycopg.Connection[Any], noop: Any
) -> None:
    max_lost = app.settings.max_lost_attempts
    r = noop.delay()
    assert lose_workers(app, db, r.id, max_lost)[-1] == "DEAD"
    assert app.broker.requeue_dead(task_name="ops.noop", all=True) == 1
    # As many lost workers again before the reclaimer dead-letters it again.
    assert lose_workers(app, db, r.id, max_lost) == ["PENDING"] * (max_lost - 1) + ["DEAD"]
    row = task_row(db, r.id)
    assert (row["attempt"], row["requeued_attempt"]) == (2 * max_lost + 1, max_lost + 1)
    assert [a[2] for a in attempts(db, r.id)].count("requeued") == 1


def test_requeue_and_discard_all_in_chunks(app: Celery, db: psycopg.Connection[Any]) -> None:
    dead = [insert(db, "DEAD", updated_at=ago(60 - i)) for i in range(5)]
    other = insert(db, "DEAD", name="ops.other")
    pending = insert(db)
    db.execute(
        "INSERT INTO results (task_id, state) SELECT unnest(%s::text[]), 'FAILURE'",
        (dead,),
    )
    seen: list[int] = []
    assert (
        app.broker.discard_dead(task_name="ops.noop", all=True, chunk=2, progress=seen.append) == 5
    )
    assert seen == [2, 4, 5]
    left = db.execute("SELECT id FROM tasks ORDER BY id").fetchall()
    assert sorted(i for (i,) in left) == sorted([other, pending])
    assert db.execute("SELECT count(*) FROM results").fetchone() == (0,)

    more = [insert(db, "DEAD") for _ in range(3)]
    assert app.broker.requeue_dead([*more, other], chunk=2) == 4
    assert app.broker.discard_dead(all=True) == 0
    assert app.broker.dead_letters(10, 0) == []


# -- the dashboard's views ------------------------------------------------------------------------


def test_task_list_detail_and_overview(app: Celery, db: psycopg.Connection[Any]) -> None:
    first = insert(db, "COMPLETED", updated_at=ago(30))
    second = insert(db, "FAILED", queue="io", name="ops.other", updated_at=ago(20))
    third = insert(db, "PENDING", updated_at=ago(10))
    add_attempt(db, first, 1, "completed")
    add_attempt(db, second, 1, "failed")
    db.execute("INSERT INTO results (task_id, state) VALUES (%s, 'SUCCESS')", (first,))

    assert [r["id"] for r in app.broker.task_list()] == [third, second, first]
    assert [r["id"] for r in app.broker.task_list(state="FAILED")] == [second]
    assert [r["id"] for r in app.broker.task_list(queue="celery", limit=1)] == [third]
    assert [r["id"] for r in app.broker.task_list(name="ops.other")] == [second]
    assert [r["id"] for r in app.broker.task_list(offset=1, limit=1)] == [second]
    now = db.execute("SELECT now()").fetchone()
    assert now is not None
    assert app.broker.task_list(since=now[0]) == []
    assert [r["id"] for r in app.broker.task_list(until=now[0], state="COMPLETED")] == [first]

    detail = app.broker.task_detail(first)
    assert detail is not None
    assert (detail["status"], detail["result_state"]) == ("COMPLETED", "SUCCESS")
    assert [a["outcome"] for a in detail["attempts"]] == ["completed"]
    assert app.broker.task_detail("missing") is None

    seen = app.broker.overview(window_seconds=600)
    assert seen["totals"] == {
        "PENDING": 1,
        "BLOCKED": 0,
        "RUNNING": 0,
        "COMPLETED": 1,
        "FAILED": 1,
        "CANCELLED": 0,
        "DEAD": 0,
    }
    by_outcome: dict[str, int] = {}
    for m in seen["minutes"]:
        by_outcome[m["outcome"]] = by_outcome.get(m["outcome"], 0) + m["n"]
    assert by_outcome == {"completed": 1, "failed": 1}
    assert seen["workers"] == []


def test_the_queue_knows_when_nothing_reclaims_its_tables(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    """Workers and ``pgtasks bench``'s steady phase say so when autovacuum is off: on the
    server (as on some CI databases), or for one of the tables that grow with every task."""
    server_off = db.execute("SELECT current_setting('autovacuum') = 'off'").fetchone()
    assert server_off is not None
    if not server_off[0]:
        assert app.broker.autovacuum_off() is False
    db.execute("ALTER TABLE attempts SET (autovacuum_enabled = false)")
    assert app.broker.autovacuum_off() is True
    # As PostgreSQL keeps the option: spelled as it was given.
    db.execute("ALTER TABLE attempts SET (autovacuum_enabled = 'OFF')")
    assert app.broker.autovacuum_off() is True
    db.execute("ALTER TABLE attempts SET (autovacuum_enabled = on)")
    assert app.broker.autovacuum_off() is bool(server_off[0])
    db.execute("ALTER TABLE attempts RESET (autovacuum_enabled)")
    assert app.broker.autovacuum_off() is bool(server_off[0])


def test_the_bench_counts_the_vacuums_of_the_queues_tables_and_the_checkpoints(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    """``pgtasks bench`` sets each window of its load phases beside the maintenance that
    finished in it: vacuums of the tasks, results and attempts tables, and checkpoints."""
    vacuums, checkpoints = BenchStore(app.broker).maintenance()
    db.execute("VACUUM tasks")
    db.execute("VACUUM attempts")
    # A table outside the queue's three is not counted.
    db.execute("CREATE TABLE elsewhere (id int)")
    db.execute("VACUUM elsewhere")
    assert BenchStore(app.broker).maintenance()[0] == vacuums + 2
    db.execute("CHECKPOINT")
    # The checkpointer reports its count as the checkpoint ends, around when the command
    # returns: wait for it.
    wait_until(
        lambda: BenchStore(app.broker).maintenance()[1] > checkpoints,
        timeout=10,
        what="the checkpoint to be counted",
    )
    after_vacuums, after_checkpoints = BenchStore(app.broker).maintenance()
    assert after_vacuums == vacuums + 2
    # Another checkpoint (of the server's own schedule, or another test's) may end meanwhile.
    assert after_checkpoints >= checkpoints + 1


@pytest.mark.parametrize("status", ["PENDING", "RUNNING", "BLOCKED"])
def test_whether_a_queue_has_unfinished_tasks_agrees_with_their_count(
    app: Celery, db: psycopg.Connection[Any], status: str
) -> None:
    """Burst workers and the bench's burn-down ask whether anything is left with a test that
    stops at the first row: it says yes exactly when the count is not zero."""
    queues = ["celery", "other"]
    assert not app.broker.any_unfinished(queues)
    # Finished rows, and rows of a queue not asked about, leave nothing to do.
    for done in ("COMPLETED", "FAILED", "CANCELLED", "DEAD"):
        insert(db, done)
    insert(db, status, queue="elsewhere")
    assert not app.broker.any_unfinished(queues)
    assert app.broker.count_unfinished(queues) == 0
    # Scheduled for later still counts as waiting.
    task_id = insert(db, status, queue="other", run_at=ago(-3600))
    assert app.broker.any_unfinished(queues)
    assert app.broker.count_unfinished(queues) == 1
    assert not app.broker.any_unfinished(["celery"])
    db.execute("UPDATE tasks SET status = 'COMPLETED', claimed_by = NULL WHERE id = %s", (task_id,))
    assert not app.broker.any_unfinished(queues)
