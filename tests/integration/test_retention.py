"""Retention: finished rows leave with their attempt history and results once past their age,
in batches until none is left, whatever the backlog; waiting, running and dead-lettered rows
stay; and a worker says so when nothing reclaims their space."""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
from psycopg import sql
from structlog.testing import capture_logs

from pgtasks import Celery, chord
from pgtasks.maintenance import Pruner
from pgtasks.records import Success
from tests.apps.harness import attempts, one, rows, wait_until


def count(db: psycopg.Connection[Any], query: str) -> int:
    row = db.execute(query).fetchone()
    assert row is not None
    return int(row[0])


def test_a_running_worker_prunes_rows_and_results_past_their_retention(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """The worker's own maintenance, not a test calling the pruner: finished rows past
    finished_task_retention go with their attempt history, results past result_expires go,
    and younger ones stay."""

    @app.task(name="retention.echo")
    def echo(value: int) -> int:
        return value

    with worker_factory(pool="threads", concurrency=2):
        old = [echo.delay(i) for i in range(3)]
        assert [r.get(timeout=10) for r in old] == [0, 1, 2]
        ids = [r.id for r in old]
        # Past both retentions by the database clock (an hour for rows, a day for results).
        db.execute(
            "UPDATE tasks SET updated_at = now() - interval '2 days' WHERE id = ANY(%s)", (ids,)
        )
        db.execute(
            "UPDATE results SET date_done = now() - interval '2 days' WHERE task_id = ANY(%s)",
            (ids,),
        )
        young = echo.delay(7)
        assert young.get(timeout=10) == 7

        def gone() -> bool:
            left = count(db, f"SELECT count(*) FROM tasks WHERE id IN {tuple(ids)}")
            kept = count(db, f"SELECT count(*) FROM results WHERE task_id IN {tuple(ids)}")
            return left == 0 and kept == 0

        wait_until(gone, timeout=20, what="the worker's pruner to delete the old rows")
    assert all(attempts(db, task_id) == [] for task_id in ids)
    assert one(db, "SELECT status FROM tasks WHERE id = %s", (young.id,))["status"] == "COMPLETED"
    assert count(db, f"SELECT count(*) FROM results WHERE task_id = '{young.id}'") == 1


def test_pruner_works_off_a_backlog_in_batches(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="retention.add")
    def add(x: int, y: int) -> int:
        return x + y

    results = add.apply_many([(i, i) for i in range(23)])
    with worker_factory(pool="threads", concurrency=2):
        assert [r.get(timeout=20) for r in results] == [2 * i for i in range(23)]
    waiting = add.apply_async((1, 1), countdown=3600).id
    dead = add.delay(2, 2).id
    db.execute("UPDATE tasks SET status = 'DEAD' WHERE id = %s", [dead])
    # Age everything on the database clock, except three finished rows.
    db.execute("UPDATE tasks SET updated_at = now() - interval '2 hours'")
    db.execute("UPDATE results SET date_done = now() - interval '2 days'")
    recent = [r.id for r in results[:3]]
    db.execute("UPDATE tasks SET updated_at = now() WHERE id = ANY(%s)", [recent])
    assert count(db, "SELECT count(*) FROM attempts") == 23

    pruner = Pruner(app.broker, task_age=3600, result_age=86400)
    pruner.BATCH = 4  # 20 aged finished rows and 23 results: several full batches
    assert pruner.run_once() == (20, 23)

    left = {r[0] for r in db.execute("SELECT id FROM tasks")}
    assert left == {*recent, waiting, dead}
    # The history goes with its rows; the kept rows keep theirs.
    history = {r[0] for r in db.execute("SELECT task_id FROM attempts")}
    assert history == set(recent)
    assert count(db, "SELECT count(*) FROM results") == 0
    assert pruner.run_once() == (0, 0)


def test_no_retention_deletes_each_success_as_it_completes(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    worker_factory: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # finished_task_retention = 0: a success takes its row, its earlier runs' history and its
    # effects with it in the completing statement; its result stays for result_expires. The
    # pruner is held off, so that what is gone was deleted by the completions.
    app.conf.finished_task_retention = 0
    monkeypatch.setattr(Pruner, "run_once", lambda self: (0, 0))
    effects = psycopg.connect(pg_dsn, autocommit=True)
    effects.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))

    @app.task(name="retention.kept_result")
    def kept_result(x: int) -> int:
        return x * 2

    @app.task(name="retention.ignored", ignore_result=True)
    def ignored() -> None:
        pass

    @app.task(name="retention.flaky", bind=True, max_retries=2)
    def flaky(self: Any) -> str:
        with effects.transaction(), self.effect("charge", connection=effects):
            pass
        if self.request.retries == 0:
            raise self.retry(countdown=0)
        return "settled"

    @app.task(name="retention.broken")
    def broken() -> None:
        raise ValueError("kept for its operator")

    @app.task(name="retention.limited", concurrency_limit=1)
    def limited(i: int) -> int:
        return i

    stored = kept_result.delay(21)
    quiet = ignored.delay()
    retried = flaky.delay()
    failed = broken.delay()
    # One at a time: each deleting completion must give the key's count back for the next.
    serial = limited.apply_many([(i,) for i in range(3)])
    try:
        with worker_factory(pool="threads", concurrency=2):
            assert stored.get(timeout=20) == 42
            assert retried.get(timeout=20) == "settled"
            with pytest.raises(ValueError):
                failed.get(timeout=20)
            assert [r.get(timeout=20) for r in serial] == [0, 1, 2]
            wait_until(lambda: not rows(db, "SELECT id FROM tasks WHERE id = %s", [quiet.id]))
    finally:
        effects.close()

    # Only the failure is left, for the pruner; the results of the successes are kept.
    left = {r["id"]: r["status"] for r in rows(db, "SELECT id, status FROM tasks")}
    assert left == {failed.id: "FAILED"}
    history = {(r["task_id"], r["outcome"]) for r in rows(db, "SELECT * FROM attempts")}
    assert history == {(failed.id, "failed")}
    assert rows(db, "SELECT * FROM effects") == []
    assert {r["task_id"] for r in rows(db, "SELECT task_id FROM results")} == {
        stored.id,
        retried.id,
        failed.id,
        *(r.id for r in serial),
    }
    assert [r["running"] for r in rows(db, "SELECT running FROM concurrency_limits")] in ([], [0])
    assert stored.state == "SUCCESS"


def test_a_deleting_completion_is_fenced_and_keeps_a_revoked_row(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="retention.noop")
    def noop() -> None:
        pass

    gone, revoked = noop.delay(), noop.delay()
    claimed = {t.id: t for t in app.broker.claim("owner", ["celery"], 2, 30.0)}
    assert set(claimed) == {gone.id, revoked.id}

    def done(worker: str, task_id: str, attempt: int) -> dict[str, str]:
        item = Success(task_id, attempt, False, "application/json", None, None)
        return app.broker.complete(worker, [item], keep=False)

    # A stale token deletes nothing.
    assert done("thief", gone.id, claimed[gone.id].attempt) == {}
    assert done("owner", gone.id, claimed[gone.id].attempt + 1) == {}
    assert len(rows(db, "SELECT * FROM tasks WHERE id = %s", [gone.id])) == 1

    assert done("owner", gone.id, claimed[gone.id].attempt) == {gone.id: "COMPLETED"}
    assert rows(db, "SELECT * FROM tasks WHERE id = %s", [gone.id]) == []
    assert done("owner", gone.id, claimed[gone.id].attempt) == {}

    # A revoke that arrived while it ran is kept, with its history, as with retention.
    assert app.broker.revoke(revoked.id) == "RUNNING"
    assert done("owner", revoked.id, claimed[revoked.id].attempt) == {revoked.id: "CANCELLED"}
    row = one(db, "SELECT status, claimed_by, error FROM tasks WHERE id = %s", [revoked.id])
    assert (row["status"], row["claimed_by"]) == ("CANCELLED", None)
    assert row["error"].startswith("revoked while running")
    assert attempts(db, revoked.id) == [(claimed[revoked.id].attempt, "owner", "cancelled")]


def test_a_chord_of_members_that_ignore_results_needs_no_finished_row(
    app: Celery, worker_factory: Any
) -> None:
    # The body reads its members' values from their results, which members keep even when
    # they ignore results otherwise: rows deleted as they complete take nothing from it.
    app.conf.finished_task_retention = 0

    @app.task(name="retention.part", ignore_result=True)
    def part(i: int) -> int:
        return i

    @app.task(name="retention.total")
    def total(values: list[Any]) -> int:
        return len(values)

    result = chord([part.s(i) for i in range(4)])(total.s())
    with worker_factory(pool="threads", concurrency=2):
        assert result.get(timeout=20) == 4


def test_a_worker_warns_when_autovacuum_is_off_for_the_task_table(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    off = db.execute("SELECT current_setting('autovacuum') = 'off'").fetchone()
    assert off is not None
    if not off[0]:
        # On a server with autovacuum on, a worker starts without the warning.
        with capture_logs() as logs, worker_factory():
            pass
        assert not [e for e in logs if e["event"] == "worker.autovacuum_off"], logs
    db.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
    try:
        with capture_logs() as logs, worker_factory():
            pass
    finally:
        db.execute("ALTER TABLE tasks RESET (autovacuum_enabled)")
    warnings = [e for e in logs if e["event"] == "worker.autovacuum_off"]
    assert len(warnings) == 1, logs
    assert warnings[0]["log_level"] == "warning"
    assert warnings[0]["schema"] == app.broker.schema
    assert "VACUUM" in warnings[0]["hint"] and "docs/operating.md" in warnings[0]["hint"]
