"""LISTEN/NOTIFY as a wake-up hint: a new due task wakes an idle worker within milliseconds,
and a revoke reaches the worker running the task as soon as it commits.

Only hints: the worker polls anyway (``poll_interval``) and learns of revokes from its lease
renewals, so a lost notification or a dropped listening connection costs latency, never a task.
Reconnects with backoff.
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
    ) -> None:
        super().__init__(name="pgtasks-listener", daemon=True)
        self.broker = broker
        self.queues = queues
        self.wake = wake
        #: Called with (task id, signal or None) when a running task is revoked.
        self.on_cancel = on_cancel
        self.cancels = cancel_channel(broker.schema)
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        backoff = 0.5
        while not self.stopped.is_set():
            try:
                with self.broker.listen_connection() as conn:
                    backoff = 0.5
                    while not self.stopped.is_set():
                        for note in conn.notifies(timeout=0.5):
                            if note.channel == self.cancels:
                                self._cancelled(note.payload)
                            elif note.payload in self.queues:
                                self.wake.set()
            except psycopg.OperationalError as exc:
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
