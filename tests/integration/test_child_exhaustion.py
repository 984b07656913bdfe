"""A prefork child that runs out of memory: a ``MemoryError`` the task sees (its address space
capped with ``RLIMIT_AS``), and a child killed by ``SIGKILL`` as the kernel's OOM killer would.
The worker survives both, the task is retried or dead-lettered by its budget, and one that does
it every time stops.

A child killed from outside and one that calls ``os._exit`` every time are in ``test_crash``.
"""

from __future__ import annotations

import os
import resource
import signal
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps.harness import advance_due, attempts, status, task_row, wait_until

#: Room left in a capped child: enough for the worker's own work, far less than the task asks.
HEADROOM = 256 * 2**20
GREED = 64 * 2**30


def vm_size() -> int:
    """This process's address space in bytes."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[0]) * resource.getpagesize()


def allocate_past_a_cap(restore: bool, headroom: int = HEADROOM) -> None:
    """Cap this process's address space near its size, then ask for far more."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    resource.setrlimit(resource.RLIMIT_AS, (vm_size() + headroom, hard))
    try:
        bytearray(GREED)
    finally:
        if restore:
            resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def define_tasks(app: Celery) -> dict[str, Any]:
    # The test process, which a task that kills itself must never be running in.
    test_pid = os.getpid()

    @app.task(name="oom.greedy")
    def greedy() -> None:
        allocate_past_a_cap(restore=True)

    @app.task(
        name="oom.greedy_retried",
        autoretry_for=(MemoryError,),
        max_retries=2,
        default_retry_delay=0,
    )
    def greedy_retried() -> None:
        allocate_past_a_cap(restore=True)

    @app.task(name="oom.starved")
    def starved() -> None:
        # The cap stays: the child is left as short of memory as a leak would leave it.
        allocate_past_a_cap(restore=False, headroom=0)

    @app.task(name="oom.killed")
    def killed() -> None:
        assert os.getpid() != test_pid, "not in a prefork child"
        os.kill(os.getpid(), signal.SIGKILL)

    @app.task(name="oom.pid")
    def pid() -> int:
        return os.getpid()

    return {
        "greedy": greedy,
        "greedy_retried": greedy_retried,
        "starved": starved,
        "killed": killed,
        "pid": pid,
    }


def test_memory_error_fails_the_task_and_the_child_goes_on(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=1) as worker:
        child = tasks["pid"].delay().get(timeout=10)
        r = tasks["greedy"].delay()
        with pytest.raises(MemoryError):
            r.get(timeout=10)
        assert tasks["pid"].delay().get(timeout=10) == child, "the child was replaced"
    row = task_row(db, r.id)
    assert (row["status"], row["attempt"], row["retries"]) == ("FAILED", 1, 0)
    assert row["error"].startswith("MemoryError")
    assert "bytearray(GREED)" in row["traceback"]
    assert attempts(db, r.id) == [(1, worker.id, "failed")]


def test_memory_error_every_time_is_retried_then_dead_lettered(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=1) as worker:
        r = tasks["greedy_retried"].delay()
        with pytest.raises(MemoryError):
            r.get(timeout=15)
        assert tasks["pid"].delay().get(timeout=10) != os.getpid()
    row = task_row(db, r.id)
    assert (row["status"], row["attempt"], row["retries"]) == ("DEAD", 3, 2)
    assert row["error"].startswith("MemoryError")
    assert row["traceback"] and "MemoryError" in row["traceback"]
    assert attempts(db, r.id) == [
        (1, worker.id, "retry"),
        (2, worker.id, "retry"),
        (3, worker.id, "dead"),
    ]


def test_child_left_without_memory_does_not_take_the_worker_down(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=1) as worker:
        r = tasks["starved"].delay()
        with pytest.raises(MemoryError):
            r.get(timeout=10)
        # Whether the starved child manages them or dies and is replaced (its task then retried
        # as lost), the tasks after it complete.
        pids = [tasks["pid"].delay().get(timeout=15) for _ in range(3)]
        assert os.getpid() not in pids
    row = task_row(db, r.id)
    assert (row["status"], row["error"]) == ("FAILED", "MemoryError: ")
    assert attempts(db, r.id) == [(1, worker.id, "failed")]


def test_child_killed_by_sigkill_every_time_is_dead_lettered(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    tasks = define_tasks(app)
    max_lost = app.settings.max_lost_attempts
    with worker_factory(pool="prefork", concurrency=1) as worker:
        r = tasks["killed"].delay()

        def dead() -> bool:
            advance_due(db)
            return status(db, r.id) == "DEAD"

        wait_until(dead, timeout=20, what="the task to be dead-lettered")
        # Replaced children run the next tasks; the dead row stays dead.
        assert tasks["pid"].delay().get(timeout=10) != os.getpid()
    row = task_row(db, r.id)
    assert (row["status"], row["attempt"], row["retries"]) == ("DEAD", max_lost, 0)
    assert row["error"] == "worker lost: WorkerLostError: child process exited with code -9"
    assert attempts(db, r.id) == [(n, worker.id, "lost") for n in range(1, max_lost)] + [
        (max_lost, worker.id, "dead")
    ]
    assert r.state == "FAILURE"
