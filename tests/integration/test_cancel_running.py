"""Cancelling running tasks against a real PostgreSQL: a revoke reaches the worker by NOTIFY (its
lease renewal is the fallback), the task sees it cooperatively, ``terminate=True`` stops a
prefork child, and the task ends REVOKED with the canceller in its history."""

from __future__ import annotations

import threading
import time
from typing import Any

import psycopg
import pytest
from structlog.testing import capture_logs

from pgtasks import Celery
from pgtasks.contrib.abortable import AbortableAsyncResult, AbortableTask
from tests.apps.harness import attempts, one, status, wait_until

LONG_LEASE = 60.0  # renewals every 20 s: anything sooner came by NOTIFY


def started(db: psycopg.Connection[Any], task_id: str) -> bool:
    return status(db, task_id) == "RUNNING"


def heard(logs: list[dict[str, Any]], task_id: str) -> list[str]:
    """How the worker heard that ``task_id`` was revoked while it ran (once: by the first)."""
    return [
        e["via"]
        for e in list(logs)
        if e["event"] == "task.cancel_requested" and e.get("task_id") == task_id
    ]


def test_a_running_task_sees_its_revoke_and_ends_revoked(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    seen = threading.Event()

    @app.task(name="cancel.loop", bind=True)
    def loop(self: Any) -> str:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.request.cancelled:
                seen.set()
                return "stopped early"
            time.sleep(0.02)
        return "ran to the end"

    with worker_factory(lease=LONG_LEASE) as worker:
        result = loop.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        result.revoke()
        assert seen.wait(10)
        wait_until(lambda: status(db, result.id) == "CANCELLED", what="the task to end")
        # The worker heard of it from the notification, long before a renewal; it lets the
        # task go once the outcome's write has returned, a moment after the row changed.
        wait_until(lambda: worker.held() == [], timeout=5, what="the worker to let go")
    assert result.state == "REVOKED"
    row = one(db, "SELECT error FROM tasks WHERE id = %s", (result.id,))
    assert row["error"].startswith("revoked while running by ")
    ((attempt, _, outcome),) = attempts(db, result.id)
    assert (attempt, outcome) == (1, "cancelled")
    history = one(db, "SELECT error FROM attempts WHERE task_id = %s", (result.id,))
    assert history["error"] == row["error"]


def test_the_worker_learns_of_a_revoke_by_notify_within_a_second(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    release = threading.Event()

    @app.task(name="cancel.wait")
    def wait() -> None:
        release.wait(30)

    with capture_logs() as logs, worker_factory(lease=LONG_LEASE):
        result = wait.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        result.revoke()
        wait_until(
            lambda: heard(logs, result.id) == ["notify"], timeout=5, what="the worker to hear of it"
        )
        release.set()
        wait_until(lambda: status(db, result.id) == "CANCELLED", what="the task to end")
    assert result.state == "REVOKED"


def test_a_lost_notification_is_made_up_by_the_next_renewal(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    release = threading.Event()

    @app.task(name="cancel.wait")
    def wait() -> None:
        release.wait(30)

    # No LISTEN: renewals only (lease 2 s).
    with capture_logs() as logs, worker_factory(listen=False):
        result = wait.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        result.revoke()
        wait_until(
            lambda: heard(logs, result.id) == ["renewal"], timeout=10, what="a renewal to report it"
        )
        release.set()
        wait_until(lambda: status(db, result.id) == "CANCELLED", what="the task to end")


@pytest.mark.parametrize("listen", [True, False], ids=["notify", "renewal"])
def test_terminate_stops_the_prefork_child_and_the_worker_goes_on(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, listen: bool
) -> None:
    @app.task(name="cancel.hang")
    def hang() -> None:
        time.sleep(60)

    @app.task(name="cancel.add")
    def add(a: int, b: int) -> int:
        return a + b

    lease = LONG_LEASE if listen else 2.0
    with worker_factory(pool="prefork", concurrency=1, lease=lease, listen=listen):
        result = hang.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        app.control.revoke(result.id, terminate=True, signal="SIGKILL")
        wait_until(lambda: status(db, result.id) == "CANCELLED", timeout=15, what="the stop")
        # Never run again, and the pool has a child for the next task.
        assert add.delay(2, 3).get(timeout=15) == 5
    assert result.state == "REVOKED"
    ((attempt, _, outcome),) = attempts(db, result.id)
    assert (attempt, outcome) == (1, "cancelled")
    row = one(db, "SELECT error FROM attempts WHERE task_id = %s", (result.id,))
    assert row["error"].startswith("revoked while running by ")
    assert row["error"].endswith("; Terminated: revoked, and its process stopped with SIGKILL")


def test_terminate_on_a_thread_pool_flags_the_task_and_says_why_it_cannot_stop_it(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="cancel.loop", bind=True)
    def loop(self: Any) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not self.request.cancelled:
            time.sleep(0.02)

    with worker_factory(lease=LONG_LEASE):
        result = loop.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        result.revoke(terminate=True)
        wait_until(lambda: status(db, result.id) == "CANCELLED", timeout=15, what="the end")
    assert result.state == "REVOKED"


def test_terminate_on_the_asyncio_pool_cancels_the_coroutine_and_the_worker_goes_on(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    import asyncio

    seen: list[str] = []

    @app.task(name="cancel.aio_loop")
    async def aio_loop() -> str:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")  # where it awaits
            raise
        return "slept"

    @app.task(name="cancel.aio_quick")
    async def aio_quick(n: int) -> int:
        return n

    with worker_factory(pool="asyncio", concurrency=2, lease=LONG_LEASE):
        result = aio_loop.delay()
        wait_until(lambda: started(db, result.id), what="the task to start")
        result.revoke(terminate=True)
        wait_until(lambda: status(db, result.id) == "CANCELLED", timeout=15, what="the end")
        assert aio_quick.delay(5).get(timeout=10) == 5
    assert result.state == "REVOKED"
    assert seen == ["cancelled"]
    ((_, _, outcome),) = attempts(db, result.id)
    assert outcome == "cancelled"
    row = one(db, "SELECT error FROM attempts WHERE task_id = %s", (result.id,))
    assert row["error"].endswith("Terminated: revoked, and its coroutine cancelled")


def test_calls_after_a_terminated_one_in_its_asyncio_slot_start_with_no_cancellation_left(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """The asyncio pool runs the calls queued behind one in the same asyncio task: a terminate
    meant for the first must leave nothing behind for the next (Python 3.11 counts a task's
    cancellations, and ``asyncio.timeout`` reads the count)."""
    import asyncio

    running = threading.Event()

    @app.task(name="cancel.aio_stuck")
    async def aio_stuck() -> str:
        running.set()
        await asyncio.sleep(30)
        return "slept"

    @app.task(name="cancel.aio_after")
    async def aio_after() -> dict[str, int]:
        current = asyncio.current_task()
        cancelling = getattr(current, "cancelling", lambda: 0)()
        await asyncio.sleep(0.01)  # an await that a cancellation left pending would break
        return {"task": id(current), "cancelling": cancelling}

    stuck = aio_stuck.delay()
    after = [aio_after.delay() for _ in range(3)]
    # One slot, and room for the three others to wait in the pool: the first claim takes all
    # four, in the order they were sent.
    with worker_factory(pool="asyncio", concurrency=1, prefetch_multiplier=4, lease=LONG_LEASE):
        assert running.wait(15), "the first call did not start"
        stuck.revoke(terminate=True)
        outcomes = [r.get(timeout=15) for r in after]
    assert stuck.state == "REVOKED"
    assert [o["cancelling"] for o in outcomes] == [0, 0, 0]
    # They ran one after another in one asyncio task.
    assert len({o["task"] for o in outcomes}) == 1


def test_a_terminate_that_arrives_after_its_call_ended_leaves_the_next_call_alone() -> None:
    import asyncio

    from pgtasks.worker.loop import running_on_loop, terminate_coroutine

    async def two_calls() -> list[str]:
        seen: list[str] = []
        with running_on_loop("call-a", None):
            # Sent as from another thread: it reaches the loop once this asyncio task awaits,
            # which it does only after the call ended.
            assert terminate_coroutine("call-a")
        # The same asyncio task goes on to the next call, which the terminate must not reach.
        with running_on_loop("call-b", None):
            await asyncio.sleep(0.01)
            seen.append("b ran to its end")
            assert terminate_coroutine("call-b")
            try:
                await asyncio.sleep(5)
            except asyncio.CancelledError:
                seen.append("b cancelled")
        return seen

    assert asyncio.run(two_calls()) == ["b ran to its end", "b cancelled"]


def test_a_revoke_with_an_unknown_signal_is_refused(
    app: Celery, db: psycopg.Connection[Any]
) -> None:
    @app.task(name="cancel.add")
    def add(a: int, b: int) -> int:
        return a + b

    result = add.delay(1, 2)
    with pytest.raises(ValueError, match="unknown signal 'SIGNOPE'"):
        result.revoke(terminate=True, signal="SIGNOPE")
    assert status(db, result.id) == "PENDING"  # nothing changed


def test_abortable_tasks_as_in_celery(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    @app.task(name="cancel.crunch", bind=True, base=AbortableTask)
    def crunch(self: Any, rows: int) -> str:
        for _ in range(rows):
            if self.is_aborted():
                return "aborted"
            time.sleep(0.02)
        return "done"

    with worker_factory(lease=LONG_LEASE):
        result = crunch.delay(1500)
        assert isinstance(result, AbortableAsyncResult)
        wait_until(lambda: started(db, result.id), what="the task to start")
        assert not result.is_aborted()
        result.abort()
        assert result.is_aborted()
        assert crunch.is_aborted(task_id=result.id)
        wait_until(lambda: status(db, result.id) == "CANCELLED", timeout=15, what="the end")
        # A waiting one never runs.
        later = crunch.apply_async((1,), countdown=3600)
        AbortableAsyncResult(later.id, app=app).abort()
        assert status(db, later.id) == "CANCELLED"
    assert result.state == "REVOKED"


def test_a_started_worker_listens_before_its_first_claim(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    """A revoke sent as soon as a worker took its first task reaches it by NOTIFY: the worker
    claims nothing (and says it is ready) only once its listener listens, even when the
    listener is slow to connect."""
    release = threading.Event()

    @app.task(name="cancel.first")
    def first() -> None:
        release.wait(30)

    listen_connection = app.broker.listen_connection

    def slow(*channels: str) -> psycopg.Connection[Any]:
        time.sleep(1.0)
        return listen_connection(*channels)

    app.broker.listen_connection = slow  # type: ignore[method-assign]
    sent = first.delay()  # waiting before the worker starts: its first claim takes it
    with capture_logs() as logs, worker_factory(lease=LONG_LEASE):
        try:
            wait_until(lambda: started(db, sent.id), what="the first claim")
            app.control.revoke(sent.id)
            # Renewals come 20 s apart: only a notification the listener heard is this quick.
            wait_until(
                lambda: any(
                    e["event"] == "task.cancel_requested" and e.get("task_id") == sent.id
                    for e in logs
                ),
                timeout=5.0,
                what="the revoke to reach the worker by NOTIFY",
            )
        finally:
            release.set()
    heard = [e for e in logs if e["event"] == "task.cancel_requested"]
    assert [e["via"] for e in heard] == ["notify"]


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_a_call_revoked_while_it_waits_for_a_slot_never_runs(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any, pool: str
) -> None:
    """As Celery discards a revoked task it has prefetched: a claimed call revoked before its
    slot frees up ends revoked without running (terminate=True or not)."""
    from pgtasks import signals

    release = threading.Event()
    ran: list[str] = []

    @app.task(name="cancel.blocker")
    def blocker() -> str:
        release.wait(20)
        return "released"

    @app.task(name="cancel.waiter")
    def waiter(n: int) -> int:
        ran.append(f"waiter {n}")
        return n

    revoked: list[Any] = []

    def on_revoked(sender: Any = None, request: Any = None, **kwargs: Any) -> None:
        revoked.append((request.id if request is not None else None, kwargs.get("terminated")))

    signals.task_revoked.connect(on_revoked)
    try:
        first = blocker.delay()
        waiting = [waiter.delay(n) for n in range(2)]
        # One slot, and room for the others to wait in the pool: the first claim takes all.
        with worker_factory(pool=pool, concurrency=1, prefetch_multiplier=4, lease=LONG_LEASE):
            wait_until(lambda: started(db, first.id), what="the first call to start")
            wait_until(
                lambda: all(started(db, r.id) for r in waiting), what="the others to be claimed"
            )
            waiting[0].revoke()
            waiting[1].revoke(terminate=True)
            time.sleep(0.3)  # the revokes reach the worker by NOTIFY while the slot is taken
            release.set()
            assert first.get(timeout=15) == "released"
            for result in waiting:
                wait_until(
                    lambda r=result: status(db, r.id) == "CANCELLED", timeout=15, what="the end"
                )
    finally:
        signals.task_revoked.disconnect(on_revoked)
    assert ran == []
    assert [r.state for r in waiting] == ["REVOKED", "REVOKED"]
    for result in waiting:
        ((attempt, _, outcome),) = attempts(db, result.id)
        assert (attempt, outcome) == (1, "cancelled")
        row = one(db, "SELECT error FROM tasks WHERE id = %s", (result.id,))
        assert row["error"].endswith("; discarded before it started")
    assert sorted(r[0] for r in revoked) == sorted(r.id for r in waiting)


def test_a_terminate_that_arrives_before_its_coroutine_begins_cancels_it_where_it_awaits() -> None:
    import asyncio

    from pgtasks.worker import loop as task_module

    async def calls() -> list[str]:
        seen: list[str] = []
        # The asyncio pool has handed "call-a" to the loop; the terminate comes before it begins.
        task_module.terminate_when_running("call-a")
        with task_module.running_on_loop("call-a", None) as terminated:
            try:
                await asyncio.sleep(5)
                seen.append("a slept")
            except asyncio.CancelledError:
                seen.append(f"a cancelled, terminated={terminated()}")
        # One that ends without awaiting leaves nothing behind for the next call.
        task_module.terminate_when_running("call-b")
        with task_module.running_on_loop("call-b", None):
            seen.append("b ran")
        with task_module.running_on_loop("call-c", None):
            await asyncio.sleep(0.05)
            seen.append("c slept")
        return seen

    assert asyncio.run(calls()) == ["a cancelled, terminated=True", "b ran", "c slept"]
