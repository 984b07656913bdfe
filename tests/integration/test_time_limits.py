"""Time limits with Celery's semantics, against real Postgres.

Soft limits raise ``SoftTimeLimitExceeded`` inside the task (prefork and threads); hard limits kill
and replace the prefork child and fail the task with ``TimeLimitExceeded`` — a FAILURE, not a
retry and not a lost worker — while the worker keeps running. A call's own limits may lower the
task's and the worker's, never lift them (a deliberate difference from Celery).
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from pgtasks import Celery, headers
from pgtasks.exceptions import SoftTimeLimitExceeded, TimeLimitExceeded
from pgtasks.worker import timelimits


def row(db: psycopg.Connection[Any], task_id: str) -> dict[str, Any]:
    cur = db.execute(
        "SELECT status, error, attempt, retries, headers FROM tasks WHERE id = %s", (task_id,)
    )
    status, error, attempt, retries, headers = cur.fetchone() or (None,) * 5
    return {
        "status": status,
        "error": error,
        "attempt": attempt,
        "retries": retries,
        "headers": headers,
    }


def outcomes(db: psycopg.Connection[Any], task_id: str) -> list[str]:
    cur = db.execute("SELECT outcome FROM attempts WHERE task_id = %s ORDER BY attempt", (task_id,))
    return [o for (o,) in cur.fetchall()]


def define_tasks(app: Celery) -> dict[str, Any]:
    @app.task(name="tl.sleep")
    def sleep(seconds: float) -> str:
        time.sleep(seconds)
        return "woke"

    @app.task(name="tl.hard", time_limit=0.5)
    def hard(seconds: float) -> str:
        time.sleep(seconds)
        return "finished"

    @app.task(name="tl.soft", soft_time_limit=0.5)
    def soft(seconds: float) -> str:
        # Short sleeps: a thread's soft limit is raised between bytecodes, not inside one call.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            time.sleep(0.01)
        return "finished"

    @app.task(name="tl.soft_caught", soft_time_limit=0.5)
    def soft_caught(seconds: float) -> str:
        try:
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                time.sleep(0.01)
        except SoftTimeLimitExceeded:
            return "cleaned up"
        return "finished"

    @app.task(name="tl.pid")
    def pid() -> int:
        return os.getpid()

    return {"sleep": sleep, "hard": hard, "soft": soft, "soft_caught": soft_caught, "pid": pid}


# -- prefork ---------------------------------------------------------------------------------------


def test_hard_limit_kills_the_child_and_fails_the_task(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=1) as worker:
        res = tasks["hard"].delay(30)
        # Half the task's 30 s: the child was killed at the limit, not waited on.
        with pytest.raises(TimeLimitExceeded):
            res.get(timeout=15)
        # The worker replaced its child and keeps running tasks.
        assert tasks["sleep"].delay(0).get(timeout=15) == "woke"
        assert worker.pool.busy() == 0
    assert res.state == "FAILURE"
    assert res.traceback and "TimeLimitExceeded" in res.traceback
    state = row(db, res.id)
    assert state["status"] == "FAILED", "a FAILURE, neither a retry nor a dead letter"
    assert state["error"].startswith("TimeLimitExceeded: hard time limit (0.5s) exceeded")
    assert (state["attempt"], state["retries"]) == (1, 0), "not treated as a lost worker"
    assert outcomes(db, res.id) == ["failed"]


def test_soft_limit_raises_inside_the_prefork_child(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=2):
        failed = tasks["soft"].delay(30)
        caught = tasks["soft_caught"].delay(30)
        with pytest.raises(SoftTimeLimitExceeded):
            failed.get(timeout=15)
        assert caught.get(timeout=15) == "cleaned up"
        assert tasks["sleep"].delay(0).get(timeout=15) == "woke"
    assert row(db, failed.id)["status"] == "FAILED"
    assert row(db, failed.id)["error"].startswith("SoftTimeLimitExceeded")
    assert row(db, caught.id)["status"] == "COMPLETED"


def test_soft_limit_comes_before_the_hard_one(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="tl.both", time_limit=3.0, soft_time_limit=0.3)
    def both() -> str:
        try:
            time.sleep(30)
        except SoftTimeLimitExceeded:
            return "soft first"
        return "finished"

    with worker_factory(pool="prefork", concurrency=1):
        assert both.delay().get(timeout=15) == "soft first"


def test_call_limits_lower_but_never_lift_the_task_and_the_worker(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=2, time_limit=60.0) as worker:
        assert worker.time_limit == 60.0
        lowered = tasks["sleep"].apply_async((30,), time_limit=0.5)
        lifted = tasks["hard"].apply_async((30,), time_limit=10)
        with pytest.raises(TimeLimitExceeded):
            lowered.get(timeout=15)
        with pytest.raises(TimeLimitExceeded):
            lifted.get(timeout=15)
    assert row(db, lowered.id)["error"].startswith("TimeLimitExceeded: hard time limit (0.5s)")
    assert row(db, lifted.id)["error"].startswith("TimeLimitExceeded: hard time limit (0.5s)")
    # The call's own limits travel as Celery's header, as written.
    assert row(db, lowered.id)["headers"]["timelimit"] == [0.5, None]
    assert row(db, lifted.id)["headers"]["timelimit"] == [10.0, None]


def test_worker_limits_apply_to_tasks_without_their_own(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    app.conf["task_soft_time_limit"] = 0.4
    with worker_factory(pool="prefork", concurrency=1, time_limit=0.8):
        soft = tasks["soft_caught"].delay(30)  # its own soft limit (0.5) wins
        hard = tasks["sleep"].delay(30)  # the setting's soft limit, then the worker's hard one
        assert soft.get(timeout=15) == "cleaned up"
        with pytest.raises(SoftTimeLimitExceeded):
            hard.get(timeout=15)


def test_max_tasks_per_child_replaces_the_child(app: Celery, worker_factory: Any) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=1, max_tasks_per_child=2):
        pids = [tasks["pid"].delay().get(timeout=15) for _ in range(5)]
    assert pids[0] == pids[1] != pids[2] == pids[3] != pids[4], pids
    assert os.getpid() not in pids


def test_max_tasks_per_child_setting(app: Celery, worker_factory: Any) -> None:
    tasks = define_tasks(app)
    app.conf["worker_max_tasks_per_child"] = 1
    with worker_factory(pool="prefork", concurrency=1):
        pids = [tasks["pid"].delay().get(timeout=15) for _ in range(3)]
    assert len(set(pids)) == 3, pids


# -- threads and solo ------------------------------------------------------------------------------


@pytest.mark.parametrize("pool", ["threads", "solo"])
def test_soft_limit_in_a_thread(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, pool: str
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool=pool, concurrency=2):
        failed = tasks["soft"].delay(30)
        with pytest.raises(SoftTimeLimitExceeded):
            failed.get(timeout=15)
        caught = tasks["soft_caught"].delay(30)
        assert caught.get(timeout=15) == "cleaned up"
        # Nothing is left pending in the pool thread for the next task.
        assert tasks["sleep"].delay(0.7).get(timeout=15) == "woke"
    assert row(db, failed.id)["status"] == "FAILED"
    assert row(db, caught.id)["status"] == "COMPLETED"


def test_hard_limit_with_threads_is_warned_about(app: Celery, worker_factory: Any) -> None:
    tasks = define_tasks(app)
    with capture_logs() as logs, worker_factory(pool="threads", time_limit=5.0):
        assert tasks["sleep"].delay(0).get(timeout=15) == "woke"
    warnings = [e for e in logs if e["event"] == "worker.time_limit_unenforced"]
    assert len(warnings) == 1, logs
    assert warnings[0]["pool"] == "threads"
    assert "tl.hard" in warnings[0]["tasks"]


def test_a_soft_limit_that_passes_after_the_task_changes_nothing() -> None:
    handler = signal.getsignal(signal.SIGALRM)
    with timelimits.soft_limit(60):
        value = "done"
    # Disarmed as the block ends: no alarm is left to go off later, and the handler before it
    # is back.
    assert signal.getitimer(signal.ITIMER_REAL) == (0.0, 0.0)
    assert signal.getsignal(signal.SIGALRM) is handler
    assert value == "done"


# -- resolution ------------------------------------------------------------------------------------


class _Task:
    time_limit: float | None = 5.0
    soft_time_limit: float | None = None


NAN, INF = float("nan"), float("inf")


@pytest.mark.parametrize(
    ("headers", "default_hard", "default_soft", "expected"),
    [
        ({}, None, None, (5.0, None)),
        ({}, 9.0, 2.0, (5.0, 2.0)),
        # The task's own limit replaces the worker's, as in Celery, above it or below.
        ({}, 1.0, None, (5.0, None)),
        # A call lowers a limit ...
        ({"timelimit": [1.0, None]}, 9.0, 2.0, (1.0, 2.0)),
        ({"timelimit": [None, 0.5]}, None, None, (5.0, 0.5)),
        ({"timelimit": [10.0, 1.0]}, 9.0, 2.0, (5.0, 1.0)),
        # ... and never lifts one.
        ({"timelimit": [1e6, 1e6]}, 9.0, 2.0, (5.0, 2.0)),
        ({"timelimit": (1e6, 1e6)}, None, None, (5.0, 1e6)),
        # What is not a pair of seconds or nulls asks for nothing.
        ({"timelimit": "junk"}, None, 3.0, (5.0, 3.0)),
        ({"timelimit": [0, -1]}, None, None, (5.0, None)),
        ({"timelimit": [NAN, NAN]}, None, 3.0, (5.0, 3.0)),
        ({"timelimit": [INF, INF]}, None, None, (5.0, None)),
        ({"timelimit": [1e300, 1e300]}, None, None, (5.0, None)),
        ({"timelimit": [10**400, -(10**400)]}, None, None, (5.0, None)),
        ({"timelimit": ["1", "1"]}, None, None, (5.0, None)),
        ({"timelimit": [True, True]}, None, None, (5.0, None)),
        ({"timelimit": [1.0, 1.0, 1.0]}, None, None, (5.0, None)),
        ({"timelimit": [[1.0], {"s": 1.0}]}, None, None, (5.0, None)),
        ({"timelimit": 1.0}, None, None, (5.0, None)),
    ],
)
def test_resolve_order(
    headers: dict[str, Any],
    default_hard: float | None,
    default_soft: float | None,
    expected: tuple[float | None, float | None],
) -> None:
    assert timelimits.resolve(headers, _Task(), default_hard, default_soft) == expected


@pytest.mark.parametrize(
    ("time_limit", "soft_time_limit"),
    [
        ("1e6", None),
        (None, "soon"),
        (NAN, None),
        (INF, None),
        (None, -1),
        (True, None),
        ([1, 2], None),
    ],
)
def test_a_call_limit_that_is_not_seconds_is_refused(time_limit: Any, soft_time_limit: Any) -> None:
    with pytest.raises((TypeError, ValueError), match="time_limit must be"):
        headers.timelimit(time_limit, soft_time_limit)


def test_a_call_limit_is_written_as_celery_writes_it() -> None:
    assert headers.timelimit(None, None) is None
    assert headers.timelimit(1, None) == [1.0, None]
    assert headers.timelimit(None, 2.5) == [None, 2.5]
    # Zero is Celery's "no limit of the call's own", which resolve() reads it as.
    assert headers.timelimit(0, 0) == [0.0, 0.0]


class _Unlimited:
    """A task object with no limit attributes at all."""


class _SoftOnly:
    soft_time_limit = 4.0


@pytest.mark.parametrize(
    ("task", "headers", "default_hard", "default_soft", "expected"),
    [
        (_Unlimited(), {}, None, None, (None, None)),
        (_Unlimited(), {"timelimit": None}, None, None, (None, None)),
        (_Unlimited(), {"timelimit": [None, None]}, None, None, (None, None)),
        (_Unlimited(), {}, 9.0, None, (9.0, None)),
        (_Unlimited(), {}, None, 2.0, (None, 2.0)),
        (_Unlimited(), {"timelimit": [1.0, 0.5]}, None, None, (1.0, 0.5)),
        (_Unlimited(), {"timelimit": [30.0, 30.0]}, 9.0, 2.0, (9.0, 2.0)),
        # Too long for a timer (setitimer would raise): no limit.
        (_Unlimited(), {"timelimit": [1e300, 1e300]}, None, None, (None, None)),
        (_Unlimited(), {}, 1e300, 1e300, (None, None)),
        (_SoftOnly(), {}, None, None, (None, 4.0)),
        (_SoftOnly(), {"timelimit": [1.0, 10.0]}, None, None, (1.0, 4.0)),
    ],
)
def test_resolve_with_no_limit_on_the_task(
    task: Any,
    headers: dict[str, Any],
    default_hard: float | None,
    default_soft: float | None,
    expected: tuple[float | None, float | None],
) -> None:
    assert timelimits.resolve(headers, task, default_hard, default_soft) == expected


def test_hard_limit_runs_the_errback(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)

    @app.task(name="tl.errback")
    def errback(task_id: str) -> str:
        return f"handled {task_id}"

    with worker_factory(pool="prefork", concurrency=1):
        res = tasks["hard"].apply_async((30,), link_error=errback.s())
        with pytest.raises(TimeLimitExceeded):
            res.get(timeout=15)

        def errback_row() -> Any:
            return db.execute("SELECT id, status FROM tasks WHERE name = 'tl.errback'").fetchone()

        deadline = time.monotonic() + 15
        while (found := errback_row()) is None or found[1] != "COMPLETED":
            assert time.monotonic() < deadline, "the errback did not run"
            time.sleep(0.05)
    assert app.AsyncResult(found[0]).get(timeout=5) == f"handled {res.id}"
