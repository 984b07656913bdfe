"""The completer's batching: how long an outcome waits for others to share its statement."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import psycopg
import pytest

from pgtasks.records import Success
from pgtasks.worker import completer as completer_module
from pgtasks.worker.completer import Completer


class RecordingBroker:
    """Stands in for the broker: records each batch of successes and owns every row."""

    # As behind PgBouncer: the completer writes on pooled connections.
    own_connections = False

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.kept: list[bool] = []

    def complete(
        self, worker: str, items: list[Success], conn: Any = None, keep: bool = True
    ) -> dict[str, str]:
        self.batches.append([i.id for i in items])
        self.kept.append(keep)
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
    assert broker.kept == [True]


def test_a_completer_keeping_no_finished_rows_asks_for_deleting_completions(
    slept: list[float],
) -> None:
    broker = RecordingBroker()
    written = threading.Semaphore(0)
    completer = Completer(broker, "w1", lambda item, status: written.release())  # type: ignore[arg-type]
    completer.keep_finished = False
    run(completer, [success("a"), success("b")], written)
    assert broker.batches == [["a", "b"]] or broker.batches == [["a"], ["b"]]
    assert set(broker.kept) == {False}


class FakeConnection:
    def __init__(self, number: int) -> None:
        self.number = number
        self.closed = False
        self.broken = False

    def close(self) -> None:
        self.closed = True


class ConnectionBroker(RecordingBroker):
    """A broker whose workers write outcomes on a connection of their own; the first write on
    the second connection finds it broken."""

    own_connections = True

    def __init__(self) -> None:
        super().__init__()
        self.opened: list[FakeConnection] = []
        self.used: list[int] = []

    def completion_connection(self) -> FakeConnection:
        self.opened.append(FakeConnection(len(self.opened) + 1))
        return self.opened[-1]

    def complete(
        self, worker: str, items: list[Success], conn: Any = None, keep: bool = True
    ) -> dict[str, str]:
        assert isinstance(conn, FakeConnection)
        self.used.append(conn.number)
        if conn.number == 1 and len(self.used) == 2:
            conn.broken = True
            raise psycopg.OperationalError("server closed the connection unexpectedly")
        return super().complete(worker, items, conn, keep)


def test_outcomes_are_written_on_the_completers_own_connection_reopened_when_broken(
    slept: list[float],
) -> None:
    broker = ConnectionBroker()
    written = threading.Semaphore(0)
    completer = Completer(broker, "w1", lambda item, status: written.release())  # type: ignore[arg-type]
    run(completer, [success("a"), success("b"), success("c")], written)
    # One connection for the first batch and the failed try of the second; the second
    # batch is written again (after the back-off) on a new one, which the third reuses.
    assert broker.used == [1, 1, 2, 2]
    assert broker.batches == [["a"], ["b"], ["c"]]
    assert slept == [0.002, 0.002, 0.1, 0.002]
    assert [c.closed for c in broker.opened] == [True, True]
