"""A task that hangs, with no time limit anywhere, under the prefork pool.

Nothing ends such a task but the worker: its lease is renewed for as long as it runs, so no other
worker takes it; ``revoke(terminate=True)`` stops its child, and the row ends CANCELLED; and a
worker told to stop kills it after ``shutdown_grace`` (cold), exits, and leaves the row to run
again elsewhere: written back as lost when the pool saw its child die, or else left RUNNING
until the lease runs out and a reclaimer puts it back.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from pgtasks import Celery
from tests.apps import hanging
from tests.apps.harness import (
    advance_due,
    attempts,
    db_clock_past,
    expire_lease,
    remote,
    status,
    task_row,
    wait_until,
    worker_processes,
)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def started_pid(hold: Path) -> int:
    """The pid of the process running the task on ``hold``, once it has started."""
    written = hanging.pid_file(hold)

    def pid() -> str | None:
        # Empty while the task is still writing it.
        return written.read_text(encoding="utf-8") if written.exists() else None

    return int(wait_until(pid, what="the task to start"))


@pytest.fixture
def hold(tmp_path: Path) -> Path:
    """The file the hanging task waits on: it hangs until the test removes it."""
    path = tmp_path / "hold"
    path.touch()
    return path


@pytest.fixture
def hang(app: Celery) -> Any:
    return app.task(name=hanging.HANG)(hanging.hang)


def test_hanging_task_keeps_its_lease_and_its_slot(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, hang: Any, hold: Path
) -> None:
    @app.task(name="hanging.pid")
    def pid() -> int:
        return os.getpid()

    with worker_factory(pool="prefork", concurrency=2, lease=1.0) as worker:
        r = hang.delay(str(hold))
        child = started_pid(hold)
        assert child != os.getpid(), "the task did not run in a prefork child"
        first = task_row(db, r.id)
        # Several leases later: the same claim, a later lease, nothing to reclaim.
        wait_until(
            lambda: db_clock_past(db, first["lease_until"], 2.0),
            what="two more leases to pass",
        )
        row = task_row(db, r.id)
        assert (row["status"], row["claimed_by"], row["attempt"]) == ("RUNNING", worker.id, 1)
        assert row["lease_until"] > first["lease_until"]
        assert app.broker.reclaim(app.settings.max_lost_attempts) == []
        # The other child goes on running tasks beside it.
        assert pid.delay().get(timeout=10) not in (child, os.getpid())
        assert alive(child)

        hold.unlink()
        assert r.get(timeout=10) == child
    assert attempts(db, r.id) == [(1, worker.id, "completed")]


def test_revoke_with_terminate_stops_the_hanging_child_and_cancels_the_task(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, hang: Any, hold: Path
) -> None:
    with (
        capture_logs() as logs,
        worker_factory(pool="prefork", concurrency=1, lease=1.0, shutdown_grace=0.3),
    ):
        r = hang.delay(str(hold))
        child = started_pid(hold)
        r.revoke(terminate=True)
        wait_until(lambda: status(db, r.id) == "CANCELLED", what="the revoke to stop the task")
        wait_until(lambda: not alive(child), what="the hanging child to be gone")
        assert any(e["event"] == "task.terminating" and e["signal"] == "SIGTERM" for e in logs), (
            logs
        )
        # The pool has a fresh child: the next task runs (the file is gone, so it returns).
        hold.unlink()
        assert hang.delay(str(hold)).get(timeout=10)
    row = task_row(db, r.id)
    assert (row["status"], row["claimed_by"], row["lease_until"]) == ("CANCELLED", None, None)
    assert r.state == "REVOKED"
    assert row["attempt"] == 1, "the revoked task ran again"


@pytest.mark.parametrize(
    ("grace", "signals"),
    [("0.5", 1), ("60", 2)],
    ids=["grace runs out", "second signal"],
)
def test_stopped_worker_kills_the_hanging_task_and_another_runs_it(
    app: Celery,
    db: psycopg.Connection[Any],
    pg_dsn: str,
    schema: str,
    worker_factory: Any,
    hang: Any,
    hold: Path,
    monkeypatch: pytest.MonkeyPatch,
    grace: str,
    signals: int,
) -> None:
    monkeypatch.setenv("PGTASKS_SHUTDOWN_GRACE", grace)
    with worker_processes(
        pg_dsn,
        schema,
        ["hang-a"],
        ready=db,
        app="tests.apps.hanging",
        pool="prefork",
        concurrency=1,
        lease=1.0,
        loglevel="INFO",
    ) as [worker]:
        r = remote(app, hanging.HANG).delay(str(hold))
        child = started_pid(hold)
        assert child != worker.pid

        def stopping() -> list[str]:
            return [e["mode"] for e in worker.events() if e["event"] == "worker.stopping"]

        worker.proc.send_signal(signal.SIGTERM)
        if signals == 2:
            # A second signal counts once the first was handled (two pending ones are one).
            wait_until(stopping, what="the warm stop to begin", details=worker.describe)
            worker.proc.send_signal(signal.SIGTERM)
        # Well within the 60 s grace of the second case: only the second signal ends it.
        try:
            code = worker.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pytest.fail(f"the worker did not exit\n{worker.describe()}")
        assert code == 0, worker.describe()
        assert not alive(child), "the hanging child outlived its worker"
        assert stopping() == ["warm", "cold"][:signals], worker.describe()
        events = [e["event"] for e in worker.events()]
        assert "worker.stopped_cold" in events, worker.describe()
        assert "Traceback" not in worker.output()

    # Not lost: written back as a lost run (due after a back-off), or still RUNNING under a
    # lease that nobody renews and that another worker's reclaimer takes back.
    row = task_row(db, r.id)
    assert row["attempt"] == 1
    assert row["status"] in ("PENDING", "RUNNING"), row
    if row["status"] == "PENDING":
        assert row["error"].startswith("worker lost: WorkerLostError"), row["error"]
        assert (row["claimed_by"], row["lease_until"]) == (None, None)
    else:
        assert row["claimed_by"] == "hang-a"
        expire_lease(db, r.id)
    advance_due(db)

    hold.unlink()
    with worker_factory(pool="prefork", concurrency=1) as other:
        wait_until(lambda: status(db, r.id) == "COMPLETED", what="another worker to run it")
    assert r.get(timeout=1) not in (child, worker.pid)
    assert attempts(db, r.id) == [(1, "hang-a", "lost"), (2, other.id, "completed")]
