"""The limits a worker sets on its tasks hold, whatever a caller or a row says.

- Time limits: a call may lower the limits its task or its worker sets (``apply_async(
  time_limit=..., soft_time_limit=...)``, the row's ``timelimit`` header) but never lift them, so
  a producer that may only enqueue cannot make a worker hang on a task its code bounds. A
  ``timelimit`` header that is not a pair of seconds or nulls asks for nothing: the row runs with
  its task's and its worker's limits. ``apply_async`` refuses such values outright.
- ``max_memory_per_child`` (KiB, Celery's ``worker_max_memory_per_child``): a prefork child whose
  resident memory passed it is replaced once its task's outcome is delivered; nothing is lost,
  the next task runs in a fresh child, and a child under the limit is kept.
"""

from __future__ import annotations

import contextlib
import json
import os
import resource
import time
import uuid
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo
from structlog.testing import capture_logs

from pgtasks import Celery, grants
from pgtasks.exceptions import ImproperlyConfigured, SoftTimeLimitExceeded, TimeLimitExceeded
from tests.apps.harness import status, task_row, wait_until

SOFT_STOP = "stopped at the soft limit"
#: Room above a child's starting size that tasks of this module other than the hog never use.
MARGIN_KIB = 64 * 1024


def define_tasks(app: Celery) -> dict[str, Any]:
    @app.task(name="lim.bounded", time_limit=0.5)
    def bounded(seconds: float) -> str:
        time.sleep(seconds)
        return "finished"

    @app.task(name="lim.soft_bounded", soft_time_limit=0.5)
    def soft_bounded(seconds: float) -> str:
        try:
            time.sleep(seconds)
        except SoftTimeLimitExceeded:
            return SOFT_STOP
        return "finished"

    @app.task(name="lim.patient")
    def patient(seconds: float) -> str:
        try:
            time.sleep(seconds)
        except SoftTimeLimitExceeded:
            return SOFT_STOP
        return "finished"

    @app.task(name="lim.stubborn")
    def stubborn(seconds: float) -> str:
        # Swallows the soft limit and sleeps on: only the hard limit stops it.
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            with contextlib.suppress(SoftTimeLimitExceeded):
                time.sleep(max(0.0, deadline - time.monotonic()))
        return "finished"

    @app.task(name="lim.pid")
    def pid() -> int:
        return os.getpid()

    @app.task(name="lim.hog")
    def hog(kib: int) -> int:
        block = bytearray(kib * 1024)
        # One write per page makes every page resident.
        page = resource.getpagesize()
        block[::page] = b"\x01" * len(range(0, len(block), page))
        del block
        return os.getpid()

    return {
        "bounded": bounded,
        "soft_bounded": soft_bounded,
        "patient": patient,
        "stubborn": stubborn,
        "pid": pid,
        "hog": hog,
    }


def rss_kib() -> int:
    """This process's resident memory now: at most what a child forked from it starts with."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() // 1024


def insert_row(conn: psycopg.Connection[Any], name: str, args: list[Any], headers: str) -> str:
    """A row written with plain SQL, as any role with INSERT on the table can (``headers`` is
    JSON text, so values Python cannot write, such as 1e400, can be tried)."""
    task_id = str(uuid.uuid4())
    conn.execute(
        "INSERT INTO tasks (id, name, payload, headers) VALUES (%s, %s, %s::json, %s::jsonb)",
        (task_id, name, json.dumps([args, {}]), headers),
    )
    return task_id


def hard_limit_failed(db: psycopg.Connection[Any], task_id: str, limit: str) -> None:
    row = task_row(db, task_id)
    assert row["status"] == "FAILED", (task_id, row["status"], row["error"])
    assert row["error"].startswith(f"TimeLimitExceeded: hard time limit ({limit}) exceeded")


# -- a call may lower a time limit, never lift it ----------------------------------------------


def test_a_call_cannot_lift_the_limits_its_task_sets(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    t = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=2):
        hard = t["bounded"].apply_async((30,), time_limit=1e6, soft_time_limit=1e6)
        soft = t["soft_bounded"].apply_async((30,), soft_time_limit=1e6)
        with pytest.raises(TimeLimitExceeded):
            hard.get(timeout=10)
        assert soft.get(timeout=10) == SOFT_STOP
    hard_limit_failed(db, hard.id, "0.5s")
    # The call's wish is kept as written; the worker just does not let it win.
    assert task_row(db, hard.id)["headers"]["timelimit"] == [1e6, 1e6]


def test_a_call_cannot_lift_the_limits_its_worker_sets(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    t = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=2, time_limit=1.0, soft_time_limit=0.3):
        hard = t["stubborn"].apply_async((30,), time_limit=1e6, soft_time_limit=1e6)
        soft = t["patient"].apply_async((30,), soft_time_limit=1e6)
        with pytest.raises(TimeLimitExceeded):
            hard.get(timeout=10)
        assert soft.get(timeout=10) == SOFT_STOP
    hard_limit_failed(db, hard.id, "1s")


def test_a_call_still_lowers_the_limits(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    t = define_tasks(app)
    with worker_factory(pool="prefork", concurrency=2, time_limit=60.0):
        hard = t["stubborn"].apply_async((30,), time_limit=0.4)
        soft = t["soft_bounded"].apply_async((30,), soft_time_limit=0.2)
        with pytest.raises(TimeLimitExceeded):
            hard.get(timeout=10)
        assert soft.get(timeout=10) == SOFT_STOP
    hard_limit_failed(db, hard.id, "0.4s")


@pytest.fixture
def producer(pg_dsn: str, schema: str) -> Iterator[str]:
    """A role given only a producer's rights on the test schema (dropped afterwards)."""
    role = f"pgt_{uuid.uuid4().hex[:8]}_producer"
    with psycopg.connect(pg_dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
        try:
            grants.apply(pg_dsn, schema, grants.Roles(producers=[role]))
            yield role
        finally:
            ident = sql.Identifier(role)
            conn.execute(sql.SQL("REASSIGN OWNED BY {} TO CURRENT_USER").format(ident))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(ident))
            conn.execute(sql.SQL("DROP ROLE {}").format(ident))


def test_a_producer_cannot_lift_a_task_limit_by_apply_async_or_by_sql(
    app: Celery,
    db: psycopg.Connection[Any],
    worker_factory: Any,
    producer: str,
    pg_dsn: str,
    schema: str,
) -> None:
    define_tasks(app)
    dsn = make_conninfo(pg_dsn, user=producer)
    producer_app = Celery("producer", broker=dsn, schema_name=schema, set_as_current=False)
    try:
        by_call = producer_app.send_task(
            "lim.bounded", args=(30,), time_limit=1e6, soft_time_limit=1e6
        ).id
    finally:
        producer_app.close()
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
        by_sql = insert_row(conn, "lim.bounded", [30], '{"timelimit": [1e300, 1e300]}')
    assert {task_row(db, i)["source"] for i in (by_call, by_sql)} == {producer}

    with worker_factory(pool="prefork", concurrency=2):
        for task_id in (by_call, by_sql):
            with pytest.raises(TimeLimitExceeded):
                app.AsyncResult(task_id).get(timeout=10)
    for task_id in (by_call, by_sql):
        hard_limit_failed(db, task_id, "0.5s")


#: Pairs of seconds, longer than the limits (some longer than a timer or a float can hold).
LONG_PAIRS = {
    "a pair far above the limits": "[1e6, 1e6]",
    "a pair too long for a timer": "[1e300, 1e300]",
    "a pair past a float": "[1e400, 1e400]",
    "a pair of integers past a float": f"[{10**400}, {10**400}]",
}
#: ``timelimit`` headers of the right shape (a pair of numbers) that no call could send: the
#: row runs, under its task's and worker's limits.
ODD_NUMBERS = {**LONG_PAIRS, "negative numbers": "[-1, -1e308]"}
#: ``timelimit`` headers that are no pair of numbers or nulls: the row is dead-lettered unrun,
#: with the reason (Celery would refuse such a message too).
SHAPELESS = {
    "numeric strings": '["1e6", "1e6"]',
    "NaN and infinity as strings": '["NaN", "Infinity"]',
    "one string": '"1e6"',
    "one number": "1e6",
    "three numbers": "[1e6, 1e6, 1e6]",
    "one number in a list": "[1e6]",
    "booleans": "[true, true]",
    "nested lists": "[[1e6], [1e6]]",
    "an object": '{"hard": 1e6, "soft": 1e6}',
}


def test_odd_timelimit_headers_neither_lift_a_limit_nor_stop_the_worker(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    t = define_tasks(app)
    rows: dict[str, tuple[str, str, str]] = {}
    for case, value in ODD_NUMBERS.items():
        headers = f'{{"timelimit": {value}}}'
        rows[case] = (
            insert_row(db, "lim.bounded", [30], headers),
            insert_row(db, "lim.soft_bounded", [30], headers),
            insert_row(db, "lim.pid", [], headers),
        )
    dead = {
        case: insert_row(db, "lim.pid", [], f'{{"timelimit": {value}}}')
        for case, value in SHAPELESS.items()
    }
    with capture_logs() as logs, worker_factory(pool="prefork", concurrency=4):
        for case, (hard, soft, plain) in rows.items():
            with pytest.raises(TimeLimitExceeded):
                app.AsyncResult(hard).get(timeout=10)
            assert app.AsyncResult(soft).get(timeout=10) == SOFT_STOP, case
            assert app.AsyncResult(plain).get(timeout=10) != os.getpid(), case
        for case, task_id in dead.items():
            wait_until(lambda task_id=task_id: status(db, task_id) == "DEAD", what=case)
            error = task_row(db, task_id)["error"]
            assert "'timelimit' must be [hard, soft]" in error, (case, error)
        # The worker is still there for the next task.
        assert t["pid"].delay().get(timeout=10) != os.getpid()
    for hard, _, _ in rows.values():
        hard_limit_failed(db, hard, "0.5s")
    # A negative limit is named in a warning, for each task, and ignored.
    ignored = [e for e in logs if e["event"] == "task.time_limit_ignored"]
    assert {e["task_name"] for e in ignored} == {"lim.bounded", "lim.soft_bounded", "lim.pid"}
    assert len({e["timelimit"] for e in ignored}) == 1


@pytest.mark.parametrize(
    "limits",
    [
        {"time_limit": "1e6"},
        {"soft_time_limit": "soon"},
        {"time_limit": float("nan")},
        {"time_limit": float("inf")},
        {"soft_time_limit": -1},
        {"time_limit": True},
        {"time_limit": [1e6, 1e6]},
    ],
    ids=repr,
)
def test_apply_async_refuses_limits_that_are_not_seconds(
    app: Celery, db: psycopg.Connection[Any], limits: dict[str, Any]
) -> None:
    t = define_tasks(app)
    (option,) = limits
    with pytest.raises((TypeError, ValueError), match=option):
        t["bounded"].apply_async((1,), **limits)
    assert db.execute("SELECT count(*) FROM tasks").fetchone() == (0,)


# -- max_memory_per_child --------------------------------------------------------------------


def memory_warnings(logs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in logs if e["event"] == "pool.child_memory_exceeded"]


def test_a_child_past_its_memory_limit_is_replaced_after_its_task(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    t = define_tasks(app)
    limit = rss_kib() + MARGIN_KIB
    with (
        capture_logs() as logs,
        worker_factory(pool="prefork", concurrency=1, max_memory_per_child=limit) as worker,
    ):
        # One at a time: rows sent together may start in any order.
        first = t["pid"].delay().get(timeout=10)
        assert t["pid"].delay().get(timeout=10) == first, "a child under the limit is kept"
        big = t["hog"].delay(limit + MARGIN_KIB)
        assert big.get(timeout=30) == first, "the task's outcome is delivered"
        after = [t["pid"].delay().get(timeout=10) for _ in range(3)]
    assert after[0] == after[1] == after[2] != first, (first, after)
    assert task_row(db, big.id)["status"] == "COMPLETED"
    [warning] = memory_warnings(logs)
    assert warning["log_level"] == "warning"
    assert (warning["worker_id"], warning["pid"]) == (worker.id, first)
    assert (warning["task_id"], warning["limit_kib"]) == (big.id, limit)
    assert warning["rss_kib"] > limit


def test_the_memory_limit_setting_composes_with_max_tasks_per_child(
    app: Celery, worker_factory: Any
) -> None:
    t = define_tasks(app)
    limit = rss_kib() + MARGIN_KIB
    app.conf["worker_max_memory_per_child"] = limit  # Celery's name for the setting
    with worker_factory(pool="prefork", concurrency=1, max_tasks_per_child=3) as worker:
        assert worker.max_memory_per_child == limit
        pids = [
            t["pid"].delay().get(timeout=10),
            t["hog"].delay(limit + MARGIN_KIB).get(timeout=30),
        ]
        pids += [t["pid"].delay().get(timeout=10) for _ in range(4)]
    # Replaced for its memory after two tasks, then for its count after three.
    assert pids[0] == pids[1] != pids[2] == pids[3] == pids[4] != pids[5], pids
    assert os.getpid() not in pids


def test_the_memory_limit_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PGTASKS_MAX_MEMORY_PER_CHILD", "200000")
    app = Celery("env", broker="postgresql://unused@localhost/unused", set_as_current=False)
    app.conf["worker_max_memory_per_child"] = 5  # the environment wins over code
    assert app.settings.max_memory_per_child == 200000
    monkeypatch.setenv("PGTASKS_MAX_MEMORY_PER_CHILD", "-1")
    bad = Celery("env", broker="postgresql://unused@localhost/unused", set_as_current=False)
    with pytest.raises(ImproperlyConfigured, match="max_memory_per_child"):
        _ = bad.settings


@pytest.mark.parametrize("pool", ["threads", "solo", "asyncio"])
def test_pools_without_children_say_the_memory_limit_does_not_apply(
    app: Celery, worker_factory: Any, pool: str
) -> None:
    t = define_tasks(app)
    with (
        capture_logs() as logs,
        worker_factory(pool=pool, concurrency=1, max_memory_per_child=100_000) as worker,
    ):
        assert t["pid"].delay().get(timeout=10) == os.getpid()
    [warning] = [e for e in logs if e["event"] == "worker.child_limits_unenforced"]
    assert (warning["worker_id"], warning["pool"]) == (worker.id, pool)
    assert warning["max_memory_per_child"] == 100_000


def test_a_prefork_worker_without_a_memory_limit_keeps_its_child(
    app: Celery, worker_factory: Any
) -> None:
    t = define_tasks(app)
    with capture_logs() as logs, worker_factory(pool="prefork", concurrency=1):
        first = t["pid"].delay().get(timeout=10)
        assert t["hog"].delay(MARGIN_KIB).get(timeout=30) == first
        assert t["pid"].delay().get(timeout=10) == first
    assert memory_warnings(logs) == []
