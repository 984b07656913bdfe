"""Groups: one bulk statement, and GroupResult's join, counters, save and restore."""

from __future__ import annotations

import threading
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, GroupResult, group
from pgtasks.exceptions import TimeoutError
from tests.apps.harness import RecordedWaits, wait_until

TIMEOUT = 20


@pytest.fixture
def tasks(app: Celery) -> dict[str, Any]:
    """Tasks registered on the test app."""

    @app.task(name="double")
    def double(x: int) -> int:
        return x * 2

    @app.task(name="explode", max_retries=0)
    def explode(x: int) -> int:
        raise RuntimeError(f"no {x}")

    return {"double": double, "explode": explode}


def test_group_is_enqueued_in_one_transaction(
    app: Celery, tasks: dict[str, Any], db: psycopg.Connection[Any]
) -> None:
    # When a 100-member group is applied
    res = group(tasks["double"].s(i) for i in range(100)).apply_async()
    # Then one transaction wrote every row (same transaction id, same time), in member order
    rows = db.execute(
        "SELECT xmin::text, created_at, headers->>'group', (headers->>'group_index')::int "
        "FROM tasks ORDER BY (headers->>'group_index')::int"
    ).fetchall()
    assert len(rows) == 100
    assert len({(r[0], r[1]) for r in rows}) == 1
    assert {r[2] for r in rows} == {res.id}
    assert [r[3] for r in rows] == list(range(100))


def test_join_returns_values_in_member_order(worker_factory: Any, tasks: dict[str, Any]) -> None:
    res = group(tasks["double"].s(i) for i in range(10)).apply_async()
    assert not res.ready() and res.completed_count() == 0
    with worker_factory(concurrency=4):
        assert res.join(timeout=TIMEOUT) == [i * 2 for i in range(10)]
    assert res.ready() and res.successful() and not res.failed()
    assert res.completed_count() == 10
    assert res.get(timeout=TIMEOUT) == [i * 2 for i in range(10)]


def test_join_times_out_without_a_worker(tasks: dict[str, Any]) -> None:
    res = group(tasks["double"].s(1), tasks["double"].s(2)).apply_async()
    with pytest.raises(TimeoutError):
        res.join(timeout=0.3)


def test_failed_member_propagates_or_is_returned(
    worker_factory: Any, tasks: dict[str, Any]
) -> None:
    res = group(tasks["double"].s(1), tasks["explode"].s(2)).apply_async()
    with worker_factory():
        with pytest.raises(RuntimeError, match="no 2"):
            res.join(timeout=TIMEOUT)
        values = res.join(timeout=TIMEOUT, propagate=False)
    assert values[0] == 2 and isinstance(values[1], RuntimeError)
    assert res.failed() and not res.successful() and res.completed_count() == 1


def test_save_and_restore(worker_factory: Any, app: Celery, tasks: dict[str, Any]) -> None:
    res = group(tasks["double"].s(i) for i in range(3)).apply_async()
    res.save()
    restored = GroupResult.restore(res.id, app=app)
    assert restored is not None
    assert restored.id == res.id and [r.id for r in restored] == [r.id for r in res]
    with worker_factory():
        assert restored.join(timeout=TIMEOUT) == [0, 2, 4]
    restored.delete()
    assert GroupResult.restore(res.id, app=app) is None


def test_restore_unknown_group_is_none(app: Celery) -> None:
    assert GroupResult.restore("no-such-group", app=app) is None


def test_group_options_apply_to_every_member(
    app: Celery, tasks: dict[str, Any], db: psycopg.Connection[Any]
) -> None:
    group(tasks["double"].s(1), tasks["double"].s(2)).apply_async(queue="bulk", priority=4)
    rows = db.execute("SELECT queue, priority FROM tasks").fetchall()
    assert rows == [("bulk", 4), ("bulk", 4)]


def test_group_in_the_callers_transaction(app: Celery, tasks: dict[str, Any]) -> None:
    with psycopg.connect(app.database_url) as conn:
        res = group(tasks["double"].s(1), tasks["double"].s(2)).apply_async(connection=conn)
        conn.rollback()
    assert all(app.broker.get_task(r.id) is None for r in res)


def test_stored_results_notify_their_channel(app: Celery, tasks: dict[str, Any]) -> None:
    res = tasks["double"].delay(1)
    listener = app.broker.result_listen_connection()
    try:
        claimed = app.broker.claim("w", ["celery"], 1, 30.0)
        from pgtasks.records import Success

        app.broker.complete("w", [Success(res.id, claimed[0].attempt, True, "application/json",
                                          b"2", None)])  # fmt: skip
        notes = list(listener.notifies(timeout=5, stop_after=1))
    finally:
        listener.close()
    assert len(notes) == 1


def test_get_is_woken_by_notify(
    worker_factory: Any, app: Celery, tasks: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A waiter blocked in get() learns of the result from NOTIFY, not from its fallback poll
    (which grows to a second)."""
    res = tasks["double"].delay(21)
    listening: list[RecordedWaits] = []
    listen = app.broker.result_listen_connection

    def recorded_listen() -> Any:
        conn = RecordedWaits(listen(), longest=1.0)
        if threading.current_thread() is waiter:
            listening.append(conn)
        return conn

    monkeypatch.setattr(app.broker, "result_listen_connection", recorded_listen)
    waiter = threading.Thread(target=lambda: res.get(timeout=TIMEOUT))
    waiter.start()
    # The fallback poll has grown to its longest pause: a poll would not come for a second.
    wait_until(
        lambda: listening and listening[0].longest_wait.is_set(),
        what="the waiter's longest pause",
    )
    with worker_factory():
        waiter.join(TIMEOUT)
    assert not waiter.is_alive() and res.date_done is not None
    assert res.get(timeout=0) == 42
    # Its last wait ended with the notification, not at the end of its pause.
    events = listening[0].events
    assert events[-1] == "notify", events
