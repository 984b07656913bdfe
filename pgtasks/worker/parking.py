"""Parking: how an idle worker asks to be woken, or handed a task, by the next enqueue.

An idle worker with a free slot waits in parked_workers (see Broker.park): enqueues of due
tasks notify a worker only while one waits there, and where the worker also takes hand-offs,
the next single enqueue of a task that can start at once names it to this worker directly.
This class keeps that bookkeeping (whether the listener hears, whether this worker is parked,
how many hand-offs reached it, when its row was last made current, how long to wait before
the next park) and writes and removes the park. A park is a hint to enqueues, nothing more:
a worker handed a task still claims its row in the database."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:
    from pgtasks.app import Celery


class Parking:
    """One worker's park in parked_workers, and what it learnt of its use.

    The loop parks (``park``) when its last claim left a slot free, and says when it claimed
    work the usual way (``busy``); the listener's thread says when a hand-off came
    (``handed``) and when it listens or stopped listening (``listening_changed``)."""

    #: How long a park lasts at least (database clock; three polls where polls are slower). An
    #: idle worker parks again after a third of it.
    PARK_SECONDS = 5.0
    #: The longest wait before an idle worker parks again after parks went unused.
    BACKOFF_MAX = 1.0
    #: The first such wait.
    BACKOFF_MIN = 0.01

    def __init__(
        self,
        app: Celery,
        worker_id: str,
        queues: list[str],
        lease: float,
        *,
        poll_interval: float,
        handoff: bool,
        log: Any,
    ) -> None:
        self._app = app
        self._id = worker_id
        self._queues = queues
        self._lease = lease
        self._log = log
        #: Whether this worker takes hand-offs (they reach it only while its listener listens).
        self.handoff = handoff
        #: Seconds a park lasts.
        self.seconds = max(self.PARK_SECONDS, 3 * poll_interval)
        #: Whether the listener listens now: no park is made while it cannot hear.
        self.listening = False
        # Set once the listener first listens (see wait_listening).
        self._first_listen = threading.Event()
        self._heard_before = False
        #: Whether this worker is parked for hand-offs now.
        self.parked = False
        self._ever_parked = False
        #: Hand-offs that reached this worker (a park that raced one is not counted as parked).
        self.handoffs = 0
        # When this worker's row in parked_workers (a park, with or without hand-offs, or the
        # wake-ups kept after one) was last made current: enqueues notify while it is.
        self._waking_at = 0.0
        # A park given up unused (the worker claimed work the usual way) is two statements for
        # nothing: under a steady flow of bulk enqueues that would be two per batch. So each
        # such park doubles the wait before the next one (up to BACKOFF_MAX), and a hand-off,
        # which shows parks are used, resets it.
        self._backoff = 0.0
        self._not_before = 0.0

    @property
    def backoff(self) -> float:
        """Seconds an idle worker now waits before it parks again for hand-offs: each park
        given up unused doubles it, up to BACKOFF_MAX; a hand-off resets it to 0."""
        return self._backoff

    @property
    def ever_parked(self) -> bool:
        """Whether this worker wrote a park since it started (a hand-off may be on its way)."""
        return self._ever_parked

    def wait_listening(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for the listener to listen for the first time."""
        return self._first_listen.wait(timeout)

    def park(self, rates: Callable[[], Iterable[str]], hand_off: bool = True) -> bool:
        """A slot is free and the last claim left it free: wait in parked_workers, so that
        enqueues of due tasks notify this worker, and where ``hand_off`` (nothing was due) let
        the next single enqueue of a task that can start now hand it straight here. Renewed
        while idle. ``rates`` gives the rate-limited task names, which are never handed. True
        when a park was written: the caller claims once more."""
        if not self.listening:
            return False
        now = time.monotonic()
        renew = self.seconds / 3
        hand_off = hand_off and self.handoff and now >= self._not_before
        if (self.parked or not hand_off) and now - self._waking_at < renew:
            # Parked already, or waiting without hand-offs: only a row about to run out is
            # written again.
            return False
        handoffs = self.handoffs
        try:
            self._app.broker.park(
                self._id,
                self._queues,
                self._lease,
                self.seconds,
                list(rates()),
                handoff=hand_off,
            )
        except psycopg.Error as exc:
            self.parked = False
            self._log.warning("worker.db_unavailable", during="park", error=str(exc).strip())
            return False
        # A task handed here while the statement ran has used this park up already.
        used = handoffs != self.handoffs
        self.parked = hand_off and not used
        self._ever_parked = True
        self._waking_at = 0.0 if used else now
        return True

    def unpark(self, waking: bool = False) -> bool:
        """No more hand-offs here (and, unless ``waking``, no more wake-ups); False when the
        database could not be told."""
        self.parked = False
        if not waking:
            self._waking_at = 0.0
        try:
            self._app.broker.unpark(self._id, self.seconds if waking else None)
        except psycopg.Error as exc:
            # The park runs out by itself; a task handed here meanwhile still runs here.
            self._log.warning("worker.db_unavailable", during="unpark", error=str(exc).strip())
            return False
        if waking:
            self._waking_at = time.monotonic()
        return True

    def busy(self) -> None:
        """The worker claimed work the usual way: a task handed here now would wait behind it.
        A park is given up, enqueues still wake the worker for a while (its slots may free up
        before it parks again), and the wait before the next park doubles."""
        if not self.parked:
            return
        self.unpark(waking=True)
        self._backoff = min(self.BACKOFF_MAX, max(self.BACKOFF_MIN, self._backoff * 2))
        self._not_before = time.monotonic() + self._backoff

    def handed(self) -> None:
        """A hand-off reached this worker: it takes this worker's row, and shows parks are
        used."""
        self.handoffs += 1
        self.parked = False
        self._waking_at = 0.0
        self._backoff = self._not_before = 0.0

    def listening_changed(self, listening: bool) -> bool:
        """The listener (re)connected, or lost its connection; no park is made while it
        cannot hear, and a park made is removed. True when it listens again after it had
        listened, on a worker that takes hand-offs: tasks handed here while it did not listen
        were never heard of, and the worker looks for them."""
        self.listening = listening
        if not listening:
            if self.parked or self._waking_at:
                self.unpark()
            return False
        self._first_listen.set()
        if not self.handoff:
            return False
        if not self._heard_before:
            self._heard_before = True
            return False
        return True
