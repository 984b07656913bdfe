"""Durable retries: the retry count and the next run_at in one fenced statement, Celery's
exponential backoff with its cap and full jitter, and dead-lettering once retries run out.

An audit trigger on the task table logs each status change with ``run_at - updated_at`` of the
writing statement (the delay it added to its own ``now()``); waiting rows are made due through
SQL instead of sleeping.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, MaxRetriesExceededError
from pgtasks.worker import Worker
from tests.apps.harness import (
    advance_due,
    attempts,
    audit,
    install_audit,
    one,
    rows,
    status,
    task_row,
    wait_until,
)

WorkerFactory = Callable[..., AbstractContextManager[Worker]]


def _requeues(db: psycopg.Connection[Any], task_id: str) -> list[dict[str, Any]]:
    return [a for a in audit(db, task_id) if a["old_status"] == "RUNNING"]


def _wait_for_status(
    db: psycopg.Connection[Any], task_ids: list[str], wanted: str, timeout: float = 20.0
) -> None:
    """Wait until every task has ``wanted`` status, making waiting rows due meanwhile."""

    def reached() -> bool:
        advance_due(db)
        found = rows(db, "SELECT status FROM tasks WHERE id = ANY(%s)", (task_ids,))
        return len(found) == len(task_ids) and all(r["status"] == wanted for r in found)

    wait_until(reached, timeout=timeout, what=f"{len(task_ids)} task(s) to be {wanted}")


def test_self_retry_writes_retries_and_run_at_in_one_fenced_statement(
    app: Celery, db: psycopg.Connection[Any], schema: str, worker_factory: WorkerFactory
) -> None:
    install_audit(db, schema)
    seen: list[int] = []

    @app.task(bind=True, max_retries=3)
    def flaky(self: Any, x: int) -> int:
        seen.append(self.request.retries)
        if self.request.retries == 0:
            raise self.retry(countdown=30, exc=ValueError("first try fails"))
        return x * 2

    with worker_factory() as worker:
        r = flaky.delay(21)
        wait_until(lambda: _requeues(db, r.id), what="the retry to be written")
        [requeue] = _requeues(db, r.id)
        assert (requeue["new_status"], requeue["old_retries"], requeue["new_retries"]) == (
            "PENDING",
            0,
            1,
        )
        assert requeue["delay"] == 30
        assert (requeue["attempt"], requeue["claimed_by"]) == (1, None)
        row = task_row(db, r.id)
        assert row["error"] == "ValueError: first try fails"
        assert "ValueError: first try fails" in row["traceback"]
        assert attempts(db, r.id) == [(1, worker.id, "retry")]
        assert r.state == "RETRY"
        assert app.broker.claim("probe", ["celery"], 10, 30.0) == [], "claimed before run_at"

        advance_due(db)
        assert r.get(timeout=10) == 42
    assert seen == [0, 1]
    row = task_row(db, r.id)
    assert (row["status"], row["attempt"], row["retries"], row["error"]) == (
        "COMPLETED",
        2,
        1,
        None,
    )
    assert attempts(db, r.id) == [(1, worker.id, "retry"), (2, worker.id, "completed")]


def test_retry_with_eta_runs_at_that_time(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    eta = one(db, "SELECT now() + interval '1 hour' AS eta")["eta"]

    @app.task(bind=True)
    def later(self: Any) -> str:
        if self.request.retries == 0:
            raise self.retry(eta=eta)
        return "ran"

    with worker_factory():
        r = later.delay()
        wait_until(lambda: task_row(db, r.id)["retries"] == 1, what="the retry to be written")
        row = task_row(db, r.id)
        assert (row["status"], row["run_at"]) == ("PENDING", eta)
        advance_due(db)
        assert r.get(timeout=10) == "ran"


def test_autoretry_backoff_doubles_up_to_the_cap_then_dead_letters(
    app: Celery, db: psycopg.Connection[Any], schema: str, worker_factory: WorkerFactory
) -> None:
    install_audit(db, schema)

    @app.task(
        autoretry_for=(OSError,),
        retry_backoff=True,
        retry_backoff_max=4,
        retry_jitter=False,
        max_retries=5,
    )
    def fetch(url: str, *, timeout: int = 10) -> str:
        raise OSError(f"cannot reach {url}")

    with worker_factory() as worker:
        r = fetch.delay("https://example.invalid/", timeout=3)
        _wait_for_status(db, [r.id], "DEAD")

    changes = _requeues(db, r.id)
    assert [(c["new_status"], c["old_retries"], c["new_retries"], c["delay"]) for c in changes] == [
        ("PENDING", 0, 1, 1),
        ("PENDING", 1, 2, 2),
        ("PENDING", 2, 3, 4),
        ("PENDING", 3, 4, 4),
        ("PENDING", 4, 5, 4),
        ("DEAD", 5, 5, changes[-1]["delay"]),
    ]
    assert attempts(db, r.id) == [(n, worker.id, "retry") for n in range(1, 6)] + [
        (6, worker.id, "dead")
    ]

    # Dead-lettered with what a requeue or a post-mortem needs.
    row = task_row(db, r.id)
    assert (row["status"], row["attempt"], row["retries"]) == ("DEAD", 6, 5)
    assert row["payload"] == [["https://example.invalid/"], {"timeout": 3}]
    assert row["error"] == "OSError: cannot reach https://example.invalid/"
    assert row["traceback"].startswith("Traceback (most recent call last)")
    assert "in fetch" in row["traceback"]
    assert r.state == "FAILURE"
    assert r.failed()
    assert "OSError: cannot reach" in (r.traceback or "")
    with pytest.raises(OSError, match=r"cannot reach https://example\.invalid/"):
        r.get(timeout=1)


def test_autoretry_backoff_jitter_stays_within_the_capped_delay(
    app: Celery, db: psycopg.Connection[Any], schema: str, worker_factory: WorkerFactory
) -> None:
    install_audit(db, schema)
    caps = [2, 4, 8, 10]  # min(2 * 2**n, 10) for retries n = 0..3

    @app.task(autoretry_for=(OSError,), retry_backoff=2, retry_backoff_max=10, max_retries=4)
    def wobbly(i: int) -> None:
        raise OSError("still down")

    with worker_factory():
        results = wobbly.apply_many([(i,) for i in range(8)])
        ids = [r.id for r in results]
        _wait_for_status(db, ids, "DEAD")

    delays: list[tuple[float, int]] = []
    for task_id in ids:
        changes = _requeues(db, task_id)
        assert [c["new_status"] for c in changes] == ["PENDING"] * 4 + ["DEAD"]
        delays += [(c["delay"], cap) for c, cap in zip(changes, caps, strict=False)]
    assert all(0 <= d <= cap and d == int(d) for d, cap in delays), delays
    # Full jitter: some delays fall below their cap and some above zero.
    assert any(d < cap for d, cap in delays), delays
    assert any(d > 0 for d, _ in delays), delays
    assert all(r.state == "FAILURE" for r in results)


def test_retry_past_max_retries_raises_and_dead_letters(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    runs: dict[str, list[int]] = {}

    @app.task(bind=True, max_retries=2)
    def stubborn(self: Any, label: str) -> None:
        runs.setdefault(label, []).append(self.request.retries)
        raise self.retry(countdown=0)

    with worker_factory():
        by_task = stubborn.delay("task default")
        by_call = stubborn.apply_async(("per call",), max_retries=0)
        _wait_for_status(db, [by_task.id, by_call.id], "DEAD")

    assert runs == {"task default": [0, 1, 2], "per call": [0]}
    for r in (by_task, by_call):
        with pytest.raises(MaxRetriesExceededError):
            r.get(timeout=1)
        assert task_row(db, r.id)["error"].startswith("MaxRetriesExceededError")
    assert [o for _, _, o in attempts(db, by_task.id)] == ["retry", "retry", "dead"]
    assert [o for _, _, o in attempts(db, by_call.id)] == ["dead"]
    assert status(db, by_task.id) == "DEAD"


def test_error_text_with_a_nul_character_is_kept_and_the_worker_goes_on(
    app: Celery, db: psycopg.Connection[Any], worker_factory: WorkerFactory
) -> None:
    @app.task(autoretry_for=(ValueError,), max_retries=1)
    def garbled() -> None:
        raise ValueError("bad \x00 byte")

    @app.task
    def fine() -> str:
        return "fine"

    with worker_factory():
        r = garbled.delay()
        _wait_for_status(db, [r.id], "DEAD")
        assert fine.delay().get(timeout=10) == "fine"
    row = task_row(db, r.id)
    assert row["error"] == "ValueError: bad \\x00 byte"
    assert "bad \\x00 byte" in row["traceback"]
    assert [o for _, _, o in attempts(db, r.id)] == ["retry", "dead"]
    with pytest.raises(ValueError, match="bad"):
        r.get(timeout=1)
