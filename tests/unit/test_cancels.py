"""A revoke flags the claim it reaches once; a notification is acted on only where the row
says the task was revoked; a terminate reaches only a call that runs."""

from __future__ import annotations

import threading
from types import SimpleNamespace
from typing import Any

import psycopg
import structlog

from pgtasks.worker.cancels import Cancels
from pgtasks.worker.inflight import InFlightBook


class Broker:
    def __init__(self, revoked: bool = True, signal: str | None = None) -> None:
        self.revoked = revoked
        self.signal = signal
        self.down = False

    def cancel_state(self, worker_id: str, task_id: str, attempt: int) -> tuple[bool, str | None]:
        if self.down:
            raise psycopg.OperationalError("gone")
        return self.revoked, self.signal

    def revoke_signal(self, task_id: str) -> str | None:
        return self.signal


class Pool:
    name = "prefork"

    def __init__(self, can: bool = True) -> None:
        self.can = can
        self.terminated: list[tuple[str, int]] = []

    def terminate(self, task_id: str, signum: int) -> bool:
        self.terminated.append((task_id, signum))
        return self.can


def cancels(broker: Broker, pool: Pool) -> tuple[Cancels, InFlightBook]:
    book = InFlightBook()
    row: Any = SimpleNamespace(id="t1", name="t", queue="celery", attempt=1)
    book.add(row)
    app: Any = SimpleNamespace(broker=broker)
    log = structlog.get_logger("test")
    return Cancels(app, "w1", pool, book, threading.Lock(), log), book


def test_a_revoke_flags_the_claim_once() -> None:
    c, book = cancels(Broker(), Pool())
    assert c.flag("t1", "notify")
    assert book["t1"].cancel_requested
    assert not c.flag("t1", "renewal")
    assert not c.flag("unknown", "notify")


def test_a_notification_the_row_denies_is_ignored() -> None:
    c, book = cancels(Broker(revoked=False), Pool())
    c.notified("t1", "SIGKILL")
    assert not book["t1"].cancel_requested


def test_a_notification_is_not_acted_on_while_the_database_cannot_say() -> None:
    broker = Broker()
    broker.down = True
    c, book = cancels(broker, Pool())
    c.notified("t1", None)
    assert not book["t1"].cancel_requested


def test_the_signal_is_the_rows_not_the_notifications() -> None:
    pool = Pool()
    c, book = cancels(Broker(signal="SIGTERM"), pool)
    book["t1"].running = True
    c.notified("t1", "SIGKILL")
    assert book["t1"].cancel_requested
    assert pool.terminated == [("t1", 15)] and book["t1"].terminated == 15


def test_a_call_waiting_for_its_slot_is_not_terminated() -> None:
    pool = Pool()
    c, book = cancels(Broker(signal="SIGTERM"), pool)
    c.renewed("t1")
    assert book["t1"].cancel_requested and pool.terminated == []


def test_a_pool_that_cannot_terminate_leaves_the_call_unmarked() -> None:
    pool = Pool(can=False)
    c, book = cancels(Broker(signal="SIGTERM"), pool)
    book["t1"].running = True
    c.renewed("t1")
    assert pool.terminated == [("t1", 15)] and book["t1"].terminated is None


def test_an_unknown_signal_is_refused() -> None:
    pool = Pool()
    c, book = cancels(Broker(), pool)
    book["t1"].running = True
    c.terminate("t1", "SIGNOPE")
    assert pool.terminated == []
