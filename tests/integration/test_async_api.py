"""The asyncio producer API against a real PostgreSQL: ``delay_async``, ``apply_async_async``
and ``get_async`` write and read the same rows as the sync calls, without blocking the loop."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

import psycopg
import pytest
from psycopg import sql

from pgtasks import Celery
from pgtasks.exceptions import TimeoutError
from pgtasks.result import EagerResult
from tests.apps.harness import one, task_row


@pytest.fixture
def work(app: Celery) -> Any:
    @app.task(name="aio.api.add")
    def add(a: int, b: int) -> int:
        return a + b

    return add


@pytest.fixture
def fails(app: Celery) -> Any:
    @app.task(name="aio.api.fails")
    def fails() -> None:
        raise KeyError("missing")

    return fails


def run(app: Celery, main: Callable[[], Awaitable[Any]]) -> Any:
    """Run ``main`` on a new loop, closing the app's async pool of that loop afterwards."""

    async def wrapped() -> Any:
        try:
            return await main()
        finally:
            await app.close_async()

    return asyncio.run(wrapped())


def test_delay_async_writes_the_row_and_get_async_waits_for_the_result(
    app: Celery, db: psycopg.Connection[Any], work: Any, worker_factory: Any
) -> None:
    async def main() -> tuple[Any, Any, int]:
        sent = await work.delay_async(2, 3)
        later = await work.apply_async_async((4, 5), countdown=3600, priority=7, queue="slow")
        row = task_row(db, later.id)
        assert (row["status"], row["priority"], row["queue"]) == ("PENDING", 7, "slow")
        # The loop is free while a result is awaited: a ticker runs beside the wait.
        ticks = 0

        async def ticker() -> None:
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        tick = asyncio.create_task(ticker())
        with worker_factory():
            value = await sent.get_async(timeout=15)
        tick.cancel()
        return sent, value, ticks

    sent, value, ticks = run(app, main)
    assert value == 5
    assert ticks > 1
    assert task_row(db, sent.id)["status"] == "COMPLETED"


def test_many_enqueues_at_once_and_the_errors_of_the_sync_api(
    app: Celery, db: psycopg.Connection[Any], work: Any, fails: Any, worker_factory: Any
) -> None:
    async def main() -> None:
        results = await asyncio.gather(*(work.delay_async(i, i) for i in range(50)))
        assert len({r.id for r in results}) == 50
        # Unique keys hold as with apply_async.
        first = await work.apply_async_async((1, 1), unique_key="k")
        again = await work.apply_async_async((2, 2), unique_key="k")
        assert again.id == first.id
        with pytest.raises(ValueError, match="already exists"):
            await work.apply_async_async((1, 1), task_id=first.id)
        with pytest.raises(TimeoutError):
            await first.get_async(timeout=0.2)  # no worker yet
        failed = await fails.delay_async()
        with worker_factory():
            with pytest.raises(KeyError, match="missing"):
                await failed.get_async(timeout=15)
            assert await failed.get_async(timeout=1, propagate=False) is not None

    run(app, main)
    assert one(db, "SELECT count(*) AS n FROM tasks")["n"] == 52


def test_an_async_connection_enqueues_in_its_transaction(
    app: Celery, db: psycopg.Connection[Any], pg_dsn: str, schema: str, work: Any
) -> None:
    async def main() -> tuple[str, str]:
        async with await psycopg.AsyncConnection.connect(pg_dsn) as conn:
            await conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
            await conn.commit()
            doomed = await work.apply_async_async((1, 1), connection=conn)
            await conn.rollback()
            kept = await work.apply_async_async((2, 2), connection=conn)
            await conn.commit()
            return doomed.id, kept.id

    doomed, kept = run(app, main)
    assert one(db, "SELECT count(*) AS n FROM tasks WHERE id = %s", (doomed,))["n"] == 0
    assert task_row(db, kept)["status"] == "PENDING"
    with pytest.raises(TypeError, match="AsyncConnection"):
        run(app, lambda: work.apply_async_async((1, 1), connection=db))


def test_eager_mode_and_a_second_event_loop(app: Celery, work: Any) -> None:
    async def main() -> Any:
        return await work.delay_async(3, 4)

    first = run(app, main)
    second = run(app, main)  # a new loop gets a pool of its own
    assert first.id != second.id
    app.conf.task_always_eager = True
    eager = run(app, main)
    assert isinstance(eager, EagerResult)
    assert eager.get() == 7


def test_get_async_reads_what_get_reads(app: Celery, work: Any, worker_factory: Any) -> None:
    sent = work.delay(20, 22)
    with worker_factory():
        assert sent.get(timeout=15) == 42
    assert run(app, lambda: sent.get_async(timeout=5)) == 42


def test_get_async_is_woken_by_the_stored_result_not_by_polling(
    app: Celery, worker_factory: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    import threading

    from pgtasks.aio import AsyncBroker

    release = threading.Event()

    @app.task(name="aio.api.slow")
    def slow() -> str:
        release.wait(10)
        return "done"

    # Each wait of the waiter on the event a stored result sets: "waiting" as it begins, then
    # "set" when the event woke it, or "timeout" when its pause ended first.
    waits: list[str] = []

    class Recorded:
        def __init__(self, event: asyncio.Event) -> None:
            self._event = event

        async def wait(self) -> bool:
            waits.append("waiting")
            try:
                await self._event.wait()
            except asyncio.CancelledError:
                waits.append("timeout")
                raise
            waits.append("set")
            return True

    original = AsyncBroker.result_event

    async def recorded(self: AsyncBroker) -> Any:
        stored = await original(self)
        return None if stored is None else Recorded(stored)

    monkeypatch.setattr(AsyncBroker, "result_event", recorded)

    async def main() -> Any:
        sent = await slow.delay_async()
        waiting = asyncio.create_task(sent.get_async(timeout=30))
        # The first pause is short; from the second on, listening, the waiter waits a second.
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 15
        while not (waits.count("waiting") >= 2 and waits[-1] == "waiting"):
            assert loop.time() < deadline, f"the waiter never listened: {waits}"
            await asyncio.sleep(0.01)
        release.set()
        return await waiting

    with worker_factory():
        assert run(app, main) == "done"
    # Its last wait ended as the stored result's notification set the event.
    assert waits[-1] == "set", waits
