"""LISTEN/NOTIFY as a wake-up hint: a new due task wakes an idle worker within milliseconds.

Only a hint: the worker polls anyway (``poll_interval``), so a lost notification or a dropped
listening connection costs latency, never a task. Reconnects with backoff.
"""

from __future__ import annotations

import threading

import psycopg
import structlog

from pgtasks.broker import Broker

log = structlog.get_logger("pgtasks")


class Listener(threading.Thread):
    def __init__(self, broker: Broker, queues: set[str], wake: threading.Event) -> None:
        super().__init__(name="pgtasks-listener", daemon=True)
        self.broker = broker
        self.queues = queues
        self.wake = wake
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
                            if note.payload in self.queues:
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
