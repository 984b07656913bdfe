"""LISTEN/NOTIFY as a wake-up hint: a new due task wakes an idle worker within milliseconds,
a revoke reaches the worker running the task as soon as it commits, and a task handed to a
parked worker (see pgtasks.broker.Broker.park) is named to it by its id.

Every notification is only a hint, which any role that can connect may send: a wake-up makes
the worker claim, a hand-off makes it claim the rows named, a revoke makes it read the row it
runs; nothing runs, stops or is cancelled unless the database says so. The worker polls anyway
(``poll_interval``) and learns of revokes from its lease renewals, so a lost notification or a
dropped listening connection costs latency, never a task. Reconnects with backoff.

With ``runs_tasks``, the listener has two threads that take turns: one listens while the other
stands by. A handed-off task that may run at once (see ThreadPool.run_here) runs on the thread
that heard of it, which first passes the turn (and the notifications it has not read yet) to
the one standing by: the task starts without waking a thread of the pool, and the connection
is never left unread.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Generator
from contextlib import AbstractContextManager
from typing import Any

import psycopg
import structlog

from pgtasks.broker import Broker, cancel_channel

log = structlog.get_logger("pgtasks")

#: What ``on_handoff`` may return: a handed-off task to run on the listener's thread.
RunHere = Callable[[], None]


class Listener(threading.Thread):
    def __init__(
        self,
        broker: Broker,
        queues: set[str],
        wake: threading.Event,
        on_cancel: Callable[[str, str | None], None] | None = None,
        handoffs: str | None = None,
        on_handoff: Callable[[str, bool], RunHere | None] | None = None,
        on_listening: Callable[[bool], None] | None = None,
        runs_tasks: Callable[[], AbstractContextManager[None]] | None = None,
    ) -> None:
        super().__init__(name="pgtasks-listener", daemon=True)
        self.broker = broker
        self.queues = queues
        self.wake = wake
        #: Called with (task id, signal or None) when a running task is revoked.
        self.on_cancel = on_cancel
        self.cancels = cancel_channel(broker.schema)
        #: The channel of tasks handed to this worker, and what receives their payloads: called
        #: with the payload and whether the task may run on this thread (another one stands by
        #: to listen meanwhile); it returns the call that runs the task here, or None.
        self.handoffs = handoffs
        self.on_handoff = on_handoff
        #: Called with True once listening (again), and with False when the connection broke:
        #: hand-offs sent meanwhile are lost, and the worker must look for them itself.
        self.on_listening = on_listening
        #: Given, the listener's threads may run handed-off tasks: each lives in this context
        #: (the pool's, for a task thread).
        self.runs_tasks = runs_tasks
        self.stopped = threading.Event()
        self._turn = threading.Lock()
        self._standing_by = 0
        self._count = threading.Lock()
        self._conn: psycopg.Connection[Any] | None = None
        self._notes: Generator[psycopg.Notify, None, None] | None = None
        self._backoff = 0.5
        self._relief: threading.Thread | None = None
        #: The threads running a task now.
        self._running: set[threading.Thread] = set()

    @property
    def standing_by(self) -> int:
        """How many of the listener's threads wait for their turn to listen (one, once both
        run, while the other listens; none while one of them runs a task it was handed)."""
        return self._standing_by

    def stop(self) -> None:
        self.stopped.set()

    def join(self, timeout: float | None = None) -> None:
        """Wait for the threads that listen; not for one running a task (a cold stop leaves
        it running, as it leaves the pool's)."""
        if self not in self._running:
            super().join(timeout)
        relief = self._relief
        if relief is not None and relief not in self._running:
            relief.join(timeout)

    def run(self) -> None:
        if self.runs_tasks is None:
            self._take_turns()
            return
        self._relief = threading.Thread(
            target=self._take_turns, name=f"{self.name}-relief", daemon=True
        )
        self._relief.start()
        self._take_turns()

    def _take_turns(self) -> None:
        with self.runs_tasks() if self.runs_tasks is not None else contextlib.nullcontext():
            while not self.stopped.is_set():
                with self._count:
                    self._standing_by += 1
                with self._turn:
                    with self._count:
                        self._standing_by -= 1
                    task = self._listen()
                if task is not None:
                    me = threading.current_thread()
                    self._running.add(me)
                    try:
                        task()
                    except Exception:  # the pool's own guard failed: keep listening
                        log.exception("worker.loop_error", during="hand-off")
                    finally:
                        self._running.discard(me)

    def _listen(self) -> RunHere | None:
        """Listen (connecting as needed) until stopped, or until a handed-off task is to run
        on this thread: then return it, leaving the notifications not read yet to the thread
        whose turn comes next."""
        while not self.stopped.is_set():
            try:
                if self._conn is None:
                    self._connect()
                assert self._conn is not None
                if self._notes is None:
                    self._notes = self._conn.notifies(timeout=0.5)
                for note in self._notes:
                    task = self._heard(note)
                    if task is not None:
                        return task
                self._notes = None
            except psycopg.OperationalError as exc:
                self._disconnect()
                if self.on_listening is not None:
                    self.on_listening(False)
                log.warning(
                    "worker.db_unavailable",
                    during="listen",
                    error=str(exc).strip(),
                    retry_in=self._backoff,
                )
                self.stopped.wait(self._backoff)
                self._backoff = min(self._backoff * 2, 10.0)
        self._disconnect()
        return None

    def _connect(self) -> None:
        channels = [self.handoffs] if self.handoffs else []
        self._conn = self.broker.listen_connection(*channels)
        self._backoff = 0.5
        if self.on_listening is not None:
            self.on_listening(True)

    def _disconnect(self) -> None:
        notes, self._notes = self._notes, None
        conn, self._conn = self._conn, None
        if notes is not None:
            # Leaves psycopg's section of the connection (held while the generator waits).
            with contextlib.suppress(psycopg.Error):
                notes.close()
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _heard(self, note: psycopg.Notify) -> RunHere | None:
        if note.channel == self.handoffs and self.on_handoff is not None:
            return self.on_handoff(note.payload, self._standing_by > 0)
        if note.channel == self.cancels:
            self._cancelled(note.payload)
        elif note.payload in self.queues:
            self.wake.set()
        return None

    def _cancelled(self, payload: str) -> None:
        if self.on_cancel is None:
            return
        task_id, _, signal = payload.rpartition(" ")
        if task_id:
            self.on_cancel(task_id, signal or None)
