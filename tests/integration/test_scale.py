"""Burn-down: ten thousand tasks across three worker processes, each completed exactly once."""

from __future__ import annotations

from typing import Any

import psycopg

from pgtasks import Celery
from tests.apps import coord
from tests.apps.harness import describe_all, one, remote, rows, wait_until, worker_processes

TOTAL = 10_000


def test_ten_thousand_tasks_complete_exactly_once_across_three_processes(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    names = [f"scale-{i}" for i in range(3)]
    with worker_processes(pg_dsn, schema, names, ready=db, concurrency=2) as workers:
        details = describe_all(workers)
        results = remote(app, coord.RECORD).apply_many([(i,) for i in range(TOTAL)])
        assert len({r.id for r in results}) == TOTAL

        def drained() -> bool:
            left = one(db, "SELECT count(*) AS n FROM tasks WHERE status <> 'COMPLETED'")["n"]
            return left == 0

        wait_until(drained, timeout=90, interval=0.2, what="the queue to drain", details=details)
        assert all(w.alive() for w in workers), details()
        assert not [p for w in workers for p in w.problems()], details()

    by_status = rows(db, "SELECT status, attempt, count(*) AS n FROM tasks GROUP BY 1, 2")
    assert [(r["status"], r["attempt"], r["n"]) for r in by_status] == [("COMPLETED", 1, TOTAL)]

    ran = one(
        db,
        "SELECT count(*) AS n, count(DISTINCT task_id) AS tasks, max(runs) AS most,"
        " max(attempt) AS attempt FROM executions",
    )
    assert (ran["n"], ran["tasks"], ran["most"], ran["attempt"]) == (TOTAL, TOTAL, 1, 1)

    history = rows(db, "SELECT outcome, attempt, count(*) AS n FROM attempts GROUP BY 1, 2")
    assert [(h["outcome"], h["attempt"], h["n"]) for h in history] == [("completed", 1, TOTAL)]
    mismatched = one(
        db,
        "SELECT count(*) AS n FROM attempts a JOIN executions e USING (task_id, attempt)"
        " WHERE a.worker <> e.worker",
    )["n"]
    assert mismatched == 0

    stored = one(
        db,
        "SELECT count(*) AS n FROM results r JOIN tasks t ON t.id = r.task_id"
        " WHERE r.state = 'SUCCESS' AND convert_from(r.result, 'UTF8')::int"
        " = (t.payload -> 0 ->> 0)::int",
    )["n"]
    assert stored == TOTAL

    per_worker = rows(db, "SELECT worker, count(*) AS n FROM executions GROUP BY worker")
    assert {w["worker"] for w in per_worker} == set(names), per_worker
