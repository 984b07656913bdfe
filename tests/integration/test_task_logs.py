"""Task log events: stable names, the fields operators filter on, and arguments shown by their
repr (redacted where the task says so)."""

from __future__ import annotations

from typing import Any

import pytest
from structlog.testing import capture_logs

from pgtasks import Celery

FIELDS = {"task_id", "task_name", "queue", "attempt", "retries", "worker_id"}


def test_a_failing_task_logs_claimed_started_and_failed_with_its_reprs(
    app: Celery, worker_factory: Any
) -> None:
    @app.task(name="logs.boom", max_retries=0)
    def boom(user: str, password: str) -> None:
        raise ValueError("no such user")

    with capture_logs() as logs, worker_factory() as worker:
        result = boom.delay("ann", password="hunter2")
        with pytest.raises(ValueError):
            result.get(timeout=10)
    mine = [e for e in logs if e.get("task_id") == result.id]
    # The enqueue is logged by the caller after its insert commits, so the worker may log
    # the claim first: the caller's event is checked on its own, the worker's in order.
    enqueued = [e for e in mine if e["event"] == "task.enqueued"]
    assert len(enqueued) == 1
    assert {"task_id", "task_name", "queue"} <= set(enqueued[0])
    # A worker parked when the call came is handed the task by the enqueue itself, and says
    # so before it claims it; one that was not parked claims it with its next claim.
    handed = [e for e in mine if e["event"] == "task.handed_off"]
    assert len(handed) <= 1
    worked = [e for e in mine if e["event"] not in ("task.enqueued", "task.handed_off")]
    names = [e["event"] for e in worked]
    assert names[:3] == ["task.claimed", "task.started", "task.failed"]
    for event in worked:
        assert FIELDS - {"worker_id"} <= set(event), event
    for event in (worked[0], worked[2]):
        assert event["worker_id"] == worker.id
    failed = next(e for e in mine if e["event"] == "task.failed")
    assert failed["error"] == "ValueError: no such user"
    assert failed["args"] == "('ann',)"
    assert failed["kwargs"] == "{'password': 'hunter2'}"
    assert "duration" in failed


def test_redacted_arguments_never_reach_the_logs(app: Celery, worker_factory: Any) -> None:
    @app.task(name="logs.login", redact=("password",), max_retries=0)
    def login(user: str, password: str) -> None:
        raise PermissionError("denied")

    with capture_logs() as logs, worker_factory():
        result = login.delay("ann", password="hunter2")
        with pytest.raises(PermissionError):
            result.get(timeout=10)
    assert "hunter2" not in repr(logs)
    failed = next(e for e in logs if e["event"] == "task.failed")
    assert failed["kwargs"] == "{'password': '***'}"
