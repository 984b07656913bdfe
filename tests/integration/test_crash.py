"""Crashes: ``kill -9`` of a worker process or of a prefork child mid-task, and a task that kills
its own process every time. Workers are CLI subprocesses with short leases; tasks block on gates
the test opens, so nothing waits on fixed sleeps."""

from __future__ import annotations

import itertools
import os
import signal
from typing import Any

import psycopg

from pgtasks import Celery
from tests.apps import coord
from tests.apps.harness import (
    advance_due,
    attempts,
    audit,
    db_clock_past,
    describe_all,
    executions,
    install_audit,
    one,
    remote,
    status,
    task_row,
    wait_until,
    worker_processes,
)


def _running_on(db: psycopg.Connection[Any], task_id: str, attempt: int) -> dict[str, Any] | None:
    """The execution record of this attempt, once the task body has started."""
    found = [e for e in executions(db, task_id) if e["attempt"] == attempt]
    return found[0] if found else None


def test_killed_worker_process_task_is_finished_by_another_after_lease_expiry(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    lease = 1.0
    with worker_processes(pg_dsn, schema, ["crash-a"], ready=db, lease=lease) as [a]:
        r = remote(app, coord.BLOCK).delay("gate-1")
        wait_until(lambda: _running_on(db, r.id, 1), what="the task to start on crash-a")
        first = task_row(db, r.id)
        assert (first["claimed_by"], first["attempt"]) == ("crash-a", 1)

        with worker_processes(pg_dsn, schema, ["crash-b"], ready=db, lease=lease) as [b]:
            details = describe_all([a, b])
            # While crash-a lives, its lease is renewed and crash-b leaves the task alone.
            wait_until(
                lambda: db_clock_past(db, first["lease_until"], 0.5),
                what="the first lease to run out",
            )
            row = task_row(db, r.id)
            assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", "crash-a", 1)

            a.kill()
            # Its last renewal: no later one can come.
            lease_at_kill = task_row(db, r.id)["lease_until"]
            coord.open_gate(db, "gate-1")
            wait_until(
                lambda: status(db, r.id) == "COMPLETED",
                timeout=15,
                what="another worker to finish the task",
                details=details,
            )
            assert r.get(timeout=1) == "gate-1"
            assert b.alive(), details()

    assert attempts(db, r.id) == [(1, "crash-a", "lost"), (2, "crash-b", "completed")]
    # Taken back only once crash-a's lease had run out, on the database clock.
    lost = one(db, "SELECT finished_at FROM attempts WHERE task_id = %s AND attempt = 1", (r.id,))
    assert lost["finished_at"] > lease_at_kill
    runs = executions(db, r.id)
    assert [(e["attempt"], e["worker"], e["runs"]) for e in runs] == [
        (1, "crash-a", 1),
        (2, "crash-b", 1),
    ]
    assert runs[0]["finished_at"] is None, "the killed worker finished the task"
    assert runs[1]["finished_at"] is not None
    assert runs[1]["started_at"] > lease_at_kill
    assert task_row(db, r.id)["error"] is None


def test_killed_prefork_child_task_is_retried_and_completed(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    with worker_processes(
        pg_dsn, schema, ["crash-fork"], ready=db, pool="prefork", concurrency=1
    ) as [worker]:
        details = describe_all([worker])
        r = remote(app, coord.BLOCK).delay("gate-2")
        started = wait_until(lambda: _running_on(db, r.id, 1), what="the task to start")
        child = started["pid"]
        assert child != worker.pid, "the task did not run in a prefork child"

        os.kill(child, signal.SIGKILL)
        wait_until(
            lambda: status(db, r.id) == "PENDING",
            what="the lost task to be put back",
            details=details,
        )
        row = task_row(db, r.id)
        assert (row["attempt"], row["retries"]) == (1, 0)
        assert row["error"].startswith("worker lost: WorkerLostError")
        assert attempts(db, r.id) == [(1, "crash-fork", "lost")]
        delay = one(
            db,
            "SELECT extract(epoch FROM run_at - updated_at) AS s FROM tasks WHERE id = %s",
            (r.id,),
        )["s"]
        assert delay > 0, "a lost task is offered again after a back-off, not at once"

        coord.open_gate(db, "gate-2")
        advance_due(db)
        wait_until(
            lambda: status(db, r.id) == "COMPLETED",
            timeout=15,
            what="the retried task to complete",
            details=details,
        )
        assert r.get(timeout=1) == "gate-2"
        assert worker.alive(), details()
        # The replacement child runs it; the worker process itself carried on.
        assert _running_on(db, r.id, 2)["pid"] not in (child, worker.pid)

    assert attempts(db, r.id) == [(1, "crash-fork", "lost"), (2, "crash-fork", "completed")]
    assert [e["runs"] for e in executions(db, r.id)] == [1, 1]


def test_task_that_kills_its_process_every_time_is_dead_lettered(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    coord.install(db)
    install_audit(db, schema)
    with worker_processes(
        pg_dsn, schema, ["crash-poison"], ready=db, pool="prefork", concurrency=1
    ) as [worker]:
        details = describe_all([worker])
        poison = remote(app, coord.EXIT_PROCESS).delay()

        def dead() -> bool:
            advance_due(db)
            return status(db, poison.id) == "DEAD"

        wait_until(dead, timeout=30, what="the poison task to be dead-lettered", details=details)
        # The worker survived it and still runs other tasks; the dead row stays dead.
        after = remote(app, coord.RECORD).delay(7)
        wait_until(
            lambda: status(db, after.id) == "COMPLETED",
            timeout=15,
            what="the next task to complete",
            details=details,
        )
        assert after.get(timeout=1) == 7
        assert worker.alive(), details()

    max_lost = app.settings.max_lost_attempts
    assert attempts(db, poison.id) == [(n, "crash-poison", "lost") for n in range(1, max_lost)] + [
        (max_lost, "crash-poison", "dead")
    ]
    assert [e["attempt"] for e in executions(db, poison.id)] == list(range(1, max_lost + 1))
    # Backed off between attempts, longer each time, never a hot loop.
    changes = [c for c in audit(db, poison.id) if c["old_status"] == "RUNNING"]
    assert [c["new_status"] for c in changes] == ["PENDING"] * (max_lost - 1) + ["DEAD"]
    delays = [c["delay"] for c in changes[:-1]]
    assert delays[0] > 0 and all(a < b for a, b in itertools.pairwise(delays)), delays
    row = task_row(db, poison.id)
    assert (row["status"], row["attempt"], row["retries"]) == ("DEAD", max_lost, 0)
    assert row["error"].startswith("worker lost")
    assert row["payload"] == [[], {}]
    assert poison.state == "FAILURE"
