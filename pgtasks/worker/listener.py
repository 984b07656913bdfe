"""LISTEN/NOTIFY as a wake-up hint: a new due task wakes an idle worker within milliseconds,
a revoke reaches the worker running the task as soon as it commits, and a task handed to a
parked worker (see pgtasks.broker.Broker.park) reaches it with its row.

Wake-ups and revokes are only hints: the worker polls anyway (``poll_interval``) and learns of
revokes from its lease renewals, so a lost notification or a dropped listening connection costs
latency, never a task. A hand-off missed while the connection was down is found when it is back
(``on_listening``). Reconnects with backoff.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import structlog

from pgtasks.broker import Broker, cancel_channel

log = structlog.get_logger("pgtasks")


class Listener(threading.Thread):
    def __init__(
        self,
        broker: Broker,
        queues: set[str],
        wake: threading.Event,
        on_cancel: Callable[[str, str | None], None] | None = None,
        handoffs: str | None = None,
        on_handoff: Callable[[str], None] | None = None,
        on_listening: Callable[[bool], None] | None = None,
    ) -> None:
        super().__init__(name="pgtasks-listener", daemon=True)
        self.broker = broker
        self.queues = queues
        self.wake = wake
        #: Called with (task id, signal or None) when a running task is revoked.
        self.on_cancel = on_cancel
        self.cancels = cancel_channel(broker.schema)
        #: The channel of tasks handed to this worker, and what receives their payloads.
        self.handoffs = handoffs
        self.on_handoff = on_handoff
        #: Called with True once listening (again), and with False when the connection broke:
        #: hand-offs sent meanwhile are lost, and the worker must look for them itself.
        self.on_listening = on_listening
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        backoff = 0.5
        while not self.stopped.is_set():
            try:
                channels = [self.handoffs] if self.handoffs else []
                with self.broker.listen_connection(*channels) as conn:
                    backoff = 0.5
                    if self.on_listening is not None:
                        self.on_listening(True)
                    while not self.stopped.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.channel == self.handoffs and self.on_handoff is not None:
                                self.on_handoff(note.payload)
                            elif note.channel == self.cancels:
                                self._cancelled(note.payload)
                            elif note.payload in self.queues:
                                self.wake.set()
            except psycopg.OperationalError as exc:
                if self.on_listening is not None:
                    self.on_listening(False)
                log.warning(
                    "worker.db_unavailable",
                    during="listen",
                    error=str(exc).strip(),
                    retry_in=backoff,
                )
                self.stopped.wait(backoff)
                backoff = min(backoff * 2, 10.0)

    def _cancelled(self, payload: str) -> None:
        if self.on_cancel is None:
            return
        task_id, _, signal = payload.rpartition(" ")
        if task_id:
            self.on_cancel(task_id, signal or None)
