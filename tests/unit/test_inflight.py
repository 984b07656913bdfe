"""The worker's in-flight book: an outcome belongs to one claim (task id and attempt). A row
this worker claims again, once a retry of it is committed or after its lease was lost, is a new
claim that an older claim's outcome or write report must not finish or remove."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from pgtasks import Celery
from pgtasks.broker import RetryAt, Success
from pgtasks.worker.worker import InFlight, Worker


def book(attempt: int) -> InFlight:
    return InFlight(SimpleNamespace(id="t1", name="t", queue="celery", attempt=attempt))  # type: ignore[arg-type]


def worker() -> Worker:
    return Worker(Celery("inflight", broker="postgresql://unused/none"), pool="threads")


def retry_of(attempt: int) -> RetryAt:
    return RetryAt("t1", attempt, 1, 0.0, None, "boom", None, "retry", None)


def test_write_report_of_an_older_claim_keeps_the_newer_claim() -> None:
    w = worker()
    newer = book(2)
    w._inflight["t1"] = newer
    # The retry of attempt 1 was committed, attempt 2 claimed, and only now is the write of
    # attempt 1 reported.
    w._written(retry_of(1), "PENDING")
    assert w._inflight["t1"] is newer
    w._written(Success("t1", 2, True, "application/json", b"null", None), "COMPLETED")
    assert "t1" not in w._inflight


def test_settling_an_older_claim_does_not_mark_the_newer_one_finishing() -> None:
    w = worker()
    sent: list[Any] = []
    w.completer = SimpleNamespace(put=sent.append)  # type: ignore[assignment]
    newer = book(3)
    w._inflight["t1"] = newer
    w._settle(retry_of(2))
    assert not newer.finishing
    assert sent == [retry_of(2)]
    w._settle(retry_of(3))
    assert newer.finishing
