"""An idle worker parks for hand-offs only while its listener hears, backs off while parks go
unused, and starts over once a hand-off shows they are used."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import psycopg
import structlog

from pgtasks.worker import parking as parking_module
from pgtasks.worker.parking import Parking


class Broker:
    def __init__(self) -> None:
        self.parks: list[dict[str, Any]] = []
        self.unparks: list[float | None] = []
        self.fail = False
        self.during_park: Any = None

    def park(
        self,
        worker_id: str,
        queues: list[str],
        lease: float,
        seconds: float,
        skip: list[str],
        handoff: bool,
    ) -> None:
        if self.fail:
            raise psycopg.OperationalError("gone")
        if self.during_park is not None:
            self.during_park()
        self.parks.append({"skip": skip, "handoff": handoff, "seconds": seconds})

    def unpark(self, worker_id: str, seconds: float | None) -> None:
        if self.fail:
            raise psycopg.OperationalError("gone")
        self.unparks.append(seconds)


def parking(handoff: bool = True, poll_interval: float = 1.0) -> tuple[Parking, Broker]:
    broker = Broker()
    app: Any = SimpleNamespace(broker=broker)
    log = structlog.get_logger("test")
    p = Parking(app, "w1", ["celery"], 7.0, poll_interval=poll_interval, handoff=handoff, log=log)
    return p, broker


def no_rates() -> list[str]:
    return ["limited"]


def test_no_park_while_the_listener_does_not_hear() -> None:
    p, broker = parking()
    assert not p.park(no_rates)
    assert broker.parks == [] and not p.ever_parked


def test_a_park_lasts_three_polls_where_polls_are_slow() -> None:
    assert parking(poll_interval=0.5)[0].seconds == Parking.PARK_SECONDS
    assert parking(poll_interval=4.0)[0].seconds == 12.0


def test_a_park_for_hand_offs_is_written_once_until_it_needs_renewing() -> None:
    p, broker = parking()
    p.listening_changed(True)
    assert p.park(no_rates)
    assert p.parked and p.ever_parked
    assert broker.parks == [{"skip": ["limited"], "handoff": True, "seconds": p.seconds}]
    assert not p.park(no_rates)  # parked already
    assert len(broker.parks) == 1


def test_a_worker_that_takes_no_hand_offs_waits_without_being_parked() -> None:
    p, broker = parking(handoff=False)
    p.listening_changed(True)
    assert p.park(no_rates)
    assert not p.parked
    assert broker.parks[0]["handoff"] is False


def test_a_hand_off_during_the_park_statement_uses_the_park_up() -> None:
    p, broker = parking()
    p.listening_changed(True)
    broker.during_park = p.handed
    assert p.park(no_rates)
    assert not p.parked and p.handoffs == 1


def test_a_failed_park_is_not_parked() -> None:
    p, broker = parking()
    p.listening_changed(True)
    broker.fail = True
    assert not p.park(no_rates)
    assert not p.parked


def test_parks_given_up_unused_back_off_and_a_hand_off_resets(monkeypatch: Any) -> None:
    now = [1000.0]
    monkeypatch.setattr(parking_module, "time", SimpleNamespace(monotonic=lambda: now[0]))
    p, broker = parking()
    p.listening_changed(True)
    assert p.backoff == 0.0
    waits = []
    for _ in range(10):
        assert p.park(no_rates) and p.parked
        p.busy()
        waits.append(p.backoff)
        assert not p.park(no_rates)  # backing off
        now[0] += p.seconds
    assert waits[0] == Parking.BACKOFF_MIN
    assert waits == sorted(waits) and waits[-1] == Parking.BACKOFF_MAX
    assert not p.parked
    assert broker.unparks and all(seconds == p.seconds for seconds in broker.unparks)
    p.handed()
    assert p.backoff == 0.0
    assert p.park(no_rates) and p.parked


def test_busy_without_a_park_writes_nothing() -> None:
    p, broker = parking()
    p.busy()
    assert broker.unparks == [] and p.backoff == 0.0


def test_losing_the_listener_removes_the_park() -> None:
    p, broker = parking()
    p.listening_changed(True)
    p.park(no_rates)
    assert not p.listening_changed(False)
    assert not p.parked and broker.unparks == [None]
    assert not p.park(no_rates)


def test_hand_offs_missed_while_not_listening_are_looked_for_after_a_reconnect() -> None:
    p, _ = parking()
    assert not p.wait_listening(0)
    assert not p.listening_changed(True)  # the first time: nothing was missed
    assert p.wait_listening(0)
    assert not p.listening_changed(False)
    assert p.listening_changed(True)


def test_no_hand_offs_nothing_to_look_for() -> None:
    p, _ = parking(handoff=False)
    p.listening_changed(True)
    p.listening_changed(False)
    assert not p.listening_changed(True)


def test_an_unpark_the_database_missed_says_so() -> None:
    p, broker = parking()
    broker.fail = True
    assert not p.unpark()
