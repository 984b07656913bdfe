"""Chaos: a worker whose clock is minutes off behaves as one with a good clock.

Every comparison of now with run_at, lease_until or expires_at is made by the database, and the
start of a run is stored as an age subtracted from the database's clock; so a countdown is not
cut short, a retry's backoff is kept, a lease is not taken from a live worker, and the attempt
history reads right, whichever way the worker's clock is off.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps import coord
from tests.apps.harness import WorkerProcess, remote, rows, wait_until

LEASE = 1.0


@pytest.mark.timeout(120)
@pytest.mark.parametrize("offset", [600.0, -600.0], ids=["ahead", "behind"])
def test_a_worker_with_a_wrong_clock_keeps_every_time_on_the_database_clock(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    offset: float,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    coord.install(db)
    monkeypatch.setenv("PGTASKS_TEST_CLOCK_OFFSET", str(offset))
    worker = WorkerProcess(pg_dsn, schema, "skewed", app="tests.apps.skewed", lease=LEASE)
    try:
        worker.wait_ready(db)
        later = remote(app, coord.RECORD).apply_async((1,), countdown=1.5)
        retried = remote(app, coord.FLAKY).delay(1.0)
        # Runs for three leases: only renewals keep it from being reclaimed.
        long = remote(app, coord.RECORD).delay(2, sleep=3 * LEASE)
        ids = [later.id, retried.id, long.id]

        def finished() -> bool:
            found = rows(db, "SELECT status FROM tasks WHERE id = ANY(%s)", (ids,))
            return all(r["status"] == "COMPLETED" for r in found)

        wait_until(finished, timeout=30, what="the tasks to finish", details=worker.describe)

        runs = {
            (r["task_id"], r["attempt"]): r
            for r in rows(db, "SELECT * FROM executions WHERE task_id = ANY(%s)", (ids,))
        }
        created = {
            r["id"]: r["created_at"]
            for r in rows(db, "SELECT id, created_at FROM tasks WHERE id = ANY(%s)", (ids,))
        }
        # The countdown ran its course on the database clock.
        [first] = [r for (task_id, _), r in runs.items() if task_id == later.id]
        assert (first["started_at"] - created[later.id]).total_seconds() >= 1.5
        # The retry waited its countdown after the first attempt.
        attempts = sorted(r for (task_id, r) in runs if task_id == retried.id)
        assert len(attempts) == 2, runs
        gap = (
            runs[(retried.id, attempts[1])]["started_at"]
            - runs[(retried.id, attempts[0])]["started_at"]
        )
        assert gap.total_seconds() >= 1.0
        # The long task kept its lease: it ran once, and nothing was reclaimed.
        assert [a for (task_id, a) in runs if task_id == long.id] == [1]
        assert not [e for e in worker.events() if e.get("event") == "lease.lost"]
        # The attempt history is on the database clock: each run's start is within a moment of
        # the start its task recorded, and before its end.
        history = rows(
            db,
            "SELECT task_id, attempt, started_at, finished_at FROM attempts"
            " WHERE task_id = ANY(%s)",
            (ids,),
        )
        assert len(history) == 4
        for h in history:
            recorded = runs[(h["task_id"], h["attempt"])]["started_at"]
            assert abs((h["started_at"] - recorded).total_seconds()) < 1.0, h
            assert h["started_at"] <= h["finished_at"], h
    finally:
        worker.close()
