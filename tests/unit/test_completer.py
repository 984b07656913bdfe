"""The completer's batching: how long an outcome waits for others to share its statement."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import pytest

from pgtasks.broker import Success
from pgtasks.worker import completer as completer_module
from pgtasks.worker.completer import Completer


class RecordingBroker:
    """Stands in for the broker: records each batch of successes and owns every row."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []

    def complete(self, worker: str, items: list[Success]) -> dict[str, str]:
        self.batches.append([i.id for i in items])
        return {i.id: "COMPLETED" for i in items}

    fail = retry = release = complete


def success(task_id: str) -> Success:
    return Success(task_id, 1, False, "application/json", None, None)


@pytest.fixture
def slept(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The lingers the completer waits, instead of waiting them."""
    waits: list[float] = []
    monkeypatch.setattr(completer_module, "time", SimpleNamespace(sleep=waits.append))
    return waits


def run(completer: Completer, items: list[Success], written: threading.Semaphore) -> None:
    completer.start()
    for item in items:
        completer.put(item)
        assert written.acquire(timeout=10)
    completer.stop(timeout=10)
    assert not completer.is_alive()


def test_outcomes_wait_longer_to_share_a_statement_while_claimed_tasks_wait(
    slept: list[float],
) -> None:
    broker = RecordingBroker()
    written = threading.Semaphore(0)
    statuses: dict[str, str | None] = {}

    def on_written(item: Any, status: str | None) -> None:
        statuses[item.id] = status
        written.release()

    backlog = [True, False, True]
    completer = Completer(broker, "w1", on_written, linger=0.002, busy_linger=0.01)  # type: ignore[arg-type]
    completer.busy = lambda: backlog.pop(0)
    run(completer, [success("a"), success("b"), success("c")], written)
    assert slept == [0.01, 0.002, 0.01]
    assert broker.batches == [["a"], ["b"], ["c"]]
    assert statuses == {"a": "COMPLETED", "b": "COMPLETED", "c": "COMPLETED"}


def test_without_a_view_of_the_backlog_the_short_linger_is_used(slept: list[float]) -> None:
    broker = RecordingBroker()
    written = threading.Semaphore(0)
    completer = Completer(broker, "w1", lambda item, status: written.release())  # type: ignore[arg-type]
    run(completer, [success("a")], written)
    assert slept == [0.002]
    assert broker.batches == [["a"]]
