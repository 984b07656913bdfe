"""``async def`` tasks run to their end on every pool (on the asyncio pool interleaved on its
loop, elsewhere one at a time per slot on a loop the slot keeps), with retries, failures and
``self.request`` as for plain functions."""

from __future__ import annotations

import asyncio
import threading
import time
from typing import Any

import psycopg
import pytest

from pgtasks import Celery
from tests.apps.harness import attempts


class Flaky(Exception):
    pass


@pytest.fixture
def tasks(app: Celery) -> dict[str, Any]:
    seen: dict[str, int] = {}

    @app.task(name="aio.add")
    async def add(a: int, b: int) -> int:
        await asyncio.sleep(0.01)
        return a + b

    @app.task(name="aio.whoami", bind=True)
    async def whoami(self: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"id": self.request.id, "cancelled": self.request.cancelled}

    @app.task(name="aio.flaky", autoretry_for=(Flaky,), retry_kwargs={"countdown": 0})
    async def flaky(key: str) -> int:
        await asyncio.sleep(0)
        seen[key] = seen.get(key, 0) + 1
        if seen[key] == 1:
            raise Flaky("first time")
        return seen[key]

    @app.task(name="aio.boom")
    async def boom() -> None:
        await asyncio.sleep(0)
        raise ValueError("boom")

    return {"add": add, "whoami": whoami, "flaky": flaky, "boom": boom}


@pytest.mark.parametrize("pool", ["threads", "prefork", "solo", "asyncio"])
def test_async_tasks_run_on_every_pool(
    app: Celery, tasks: dict[str, Any], worker_factory: Any, pool: str
) -> None:
    with worker_factory(pool=pool, concurrency=1 if pool != "threads" else 2):
        results = [tasks["add"].delay(i, i) for i in range(5)]
        assert [r.get(timeout=15) for r in results] == [0, 2, 4, 6, 8]
        me = tasks["whoami"].delay()
        assert me.get(timeout=15) == {"id": me.id, "cancelled": False}


@pytest.mark.parametrize("pool", ["threads", "asyncio"])
def test_an_async_task_retries_and_fails_like_a_plain_one(
    app: Celery,
    db: psycopg.Connection[Any],
    tasks: dict[str, Any],
    worker_factory: Any,
    pool: str,
) -> None:
    with worker_factory(pool=pool):
        retried = tasks["flaky"].delay("k")
        assert retried.get(timeout=15) == 2
        failed = tasks["boom"].delay()
        with pytest.raises(ValueError, match="boom"):
            failed.get(timeout=15)
    history = [outcome for _, _, outcome in attempts(db, retried.id)]
    assert len(history) == 2 and history[-1] == "completed", history
    assert failed.state == "FAILURE"


def test_an_eager_async_task_runs_even_inside_a_running_event_loop(
    app: Celery, tasks: dict[str, Any]
) -> None:
    app.conf.task_always_eager = True
    assert tasks["add"].delay(2, 3).get() == 5

    async def endpoint() -> int:
        # As a web handler would: .delay() from async code, with eager calls in tests.
        return int(tasks["add"].delay(4, 5).get())

    assert asyncio.run(endpoint()) == 9


def test_the_asyncio_pool_interleaves_calls_on_one_shared_loop(
    app: Celery, worker_factory: Any
) -> None:
    arrived: list[str] = []
    n = 20

    @app.task(name="aio.rendezvous", bind=True)
    async def rendezvous(self: Any) -> dict[str, Any]:
        # Each call waits until all n have started: only calls running at once get through.
        arrived.append(self.request.id)
        for _ in range(1000):
            if len(arrived) >= n:
                break
            await asyncio.sleep(0.01)
        await asyncio.sleep(0)  # the request is still this call's after other calls ran
        return {"id": self.request.id, "loop": id(asyncio.get_running_loop())}

    @app.task(name="aio.plain")
    def plain(x: int) -> int:
        return x * 2

    with worker_factory(pool="asyncio", concurrency=n):
        results = [rendezvous.delay() for _ in range(n)]
        answers = [r.get(timeout=30) for r in results]
        assert plain.delay(21).get(timeout=10) == 42
    assert len(arrived) == n
    assert [a["id"] for a in answers] == [r.id for r in results]
    assert len({a["loop"] for a in answers}) == 1


def test_a_soft_time_limit_stops_an_async_call_on_the_asyncio_pool(
    app: Celery, worker_factory: Any
) -> None:
    from pgtasks.exceptions import SoftTimeLimitExceeded

    seen: list[str] = []

    @app.task(name="aio.sleepy", soft_time_limit=0.3)
    async def sleepy() -> str:
        try:
            await asyncio.sleep(30)
        except SoftTimeLimitExceeded:
            seen.append("soft limit")  # raised where the coroutine awaits, as in Celery
            raise
        return "woke"

    @app.task(name="aio.tidy", soft_time_limit=0.3)
    async def tidy() -> str:
        try:
            await asyncio.sleep(30)
        except SoftTimeLimitExceeded:
            await asyncio.sleep(0.05)  # it may still await while it cleans up
            return "cleaned up"
        return "woke"

    with worker_factory(pool="asyncio", concurrency=2):
        result = sleepy.delay()
        with pytest.raises(SoftTimeLimitExceeded):
            result.get(timeout=15)
        # Caught, the limit lets the task finish: its value is the result.
        assert tidy.delay().get(timeout=15) == "cleaned up"
    assert seen == ["soft limit"]


def test_the_asyncio_pool_runs_async_calls_on_its_loop_and_plain_ones_in_threads(
    app: Celery, worker_factory: Any
) -> None:
    from pgtasks import signals
    from pgtasks.utils.state import get_current_task

    prerun: dict[str, str] = {}

    def on_prerun(task_id: str, **kwargs: Any) -> None:
        prerun[task_id] = threading.current_thread().name

    @app.task(name="aio.where", bind=True)
    async def where(self: Any) -> dict[str, Any]:
        await asyncio.sleep(0)
        current = get_current_task()
        return {
            "thread": threading.current_thread().name,
            "task": current.name if current else None,
            "id": self.request.id,
        }

    @app.task(name="aio.plain_where")
    def plain_where() -> str:
        return threading.current_thread().name

    signals.task_prerun.connect(on_prerun, weak=False)
    try:
        with worker_factory(pool="asyncio", concurrency=4):
            call = where.delay()
            plain = plain_where.delay()
            answer = call.get(timeout=15)
            plain_thread = plain.get(timeout=15)
    finally:
        signals.task_prerun.disconnect(on_prerun)
    # The whole call, its signals included, runs on the loop's thread: no hand-off per call.
    assert answer == {"thread": "pgtasks-asyncio", "task": "aio.where", "id": call.id}
    assert prerun[call.id] == "pgtasks-asyncio"
    assert plain_thread.startswith("pgtasks-task-") and prerun[plain.id] == plain_thread


def test_the_asyncio_pool_runs_no_more_calls_at_once_than_its_slots(
    app: Celery, worker_factory: Any
) -> None:
    running: list[int] = [0]
    most: list[int] = [0]
    lock = threading.Lock()

    def enter() -> None:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])

    def leave() -> None:
        with lock:
            running[0] -= 1

    @app.task(name="aio.slot")
    async def slot() -> None:
        enter()
        try:
            await asyncio.sleep(0.05)
        finally:
            leave()

    @app.task(name="aio.plain_slot")
    def plain_slot() -> None:
        enter()
        try:
            time.sleep(0.05)
        finally:
            leave()

    with worker_factory(pool="asyncio", concurrency=3):
        results = [(slot if i % 3 else plain_slot).delay() for i in range(15)]
        for r in results:
            r.get(timeout=30)
    # Async calls and plain functions share the three slots.
    assert most[0] == 3


@pytest.mark.parametrize("pool", ["threads", "solo", "prefork"])
def test_async_calls_on_a_pool_thread_share_its_event_loop_from_call_to_call(
    app: Celery, worker_factory: Any, pool: str
) -> None:
    kept: dict[str, asyncio.Future[None]] = {}

    @app.task(name="aio.kept_loop")
    async def kept_loop() -> dict[str, bool]:
        # As a client kept at module level would: made on the first call's loop, used later.
        loop = asyncio.get_running_loop()
        first = kept.setdefault("future", loop.create_future())
        await asyncio.sleep(0)
        return {"same loop": first.get_loop() is loop, "closed": first.get_loop().is_closed()}

    with worker_factory(pool=pool, concurrency=1):
        answers = [kept_loop.delay().get(timeout=15) for _ in range(3)]
    assert answers == [{"same loop": True, "closed": False}] * 3


def test_tasks_an_async_call_leaves_running_are_cancelled_when_it_ends(
    app: Celery, worker_factory: Any
) -> None:
    seen: list[str] = []

    async def background() -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise

    @app.task(name="aio.leaves_one")
    async def leaves_one() -> str:
        asyncio.get_running_loop().create_task(background())
        await asyncio.sleep(0)
        return "returned"

    with worker_factory(pool="threads", concurrency=1):
        assert leaves_one.delay().get(timeout=15) == "returned"
        # Cancelled as the call ended, before its outcome was written.
        assert seen == ["cancelled"]


@pytest.mark.parametrize("pool", ["threads", "prefork"])
def test_a_soft_time_limit_stops_an_async_call_and_the_loop_serves_the_next(
    app: Celery, tasks: dict[str, Any], worker_factory: Any, pool: str
) -> None:
    from pgtasks.exceptions import SoftTimeLimitExceeded

    @app.task(name="aio.stuck", soft_time_limit=0.3)
    async def stuck() -> str:
        await asyncio.sleep(30)
        return "woke"

    @app.task(name="aio.tidy_up", soft_time_limit=0.3)
    async def tidy_up() -> str:
        try:
            await asyncio.sleep(30)
        except SoftTimeLimitExceeded:
            await asyncio.sleep(0.05)  # raised where it awaits: it may still await
            return "cleaned up"
        return "woke"

    with worker_factory(pool=pool, concurrency=1):
        # Well before the 30 s sleep ends: the limit reaches the loop's wait at once.
        with pytest.raises(SoftTimeLimitExceeded):
            stuck.delay().get(timeout=10)
        assert tidy_up.delay().get(timeout=10) == "cleaned up"
        assert tasks["add"].delay(20, 22).get(timeout=15) == 42
