"""The lease keeper: renews every in-flight lease in one statement every lease/3 seconds.

Rows missing from the renewal's answer were lost (the lease expired and another worker took the
task, or it was edited away): the worker will discard their outcomes. The answer also carries
``cancel_requested``, which is how a running task learns it was revoked.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import psycopg
import structlog

from pgtasks.broker import Broker
from pgtasks.metrics import NullMetrics

log = structlog.get_logger("pgtasks")


class LeaseKeeper(threading.Thread):
    def __init__(
        self,
        broker: Broker,
        worker_id: str,
        lease: float,
        owned: Callable[[], list[tuple[str, int, object]]],
        on_lost: Callable[[str, int, object], None],
        on_cancel: Callable[[str], None],
    ) -> None:
        super().__init__(name="pgtasks-lease", daemon=True)
        self.broker = broker
        self.worker_id = worker_id
        self.lease = lease
        self.interval = lease / 3.0
        self.owned = owned
        self.on_lost = on_lost
        self.on_cancel = on_cancel
        self.metrics: NullMetrics = NullMetrics()
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        while not self.stopped.wait(self.interval):
            try:
                self.renew_once()
            except psycopg.OperationalError as exc:
                log.warning("worker.db_unavailable", during="renew", error=str(exc).strip())
            except Exception:
                log.exception("worker.loop_error", during="renew")
                self.metrics.loop_error("renew")

    def renew_once(self) -> None:
        owned = self.owned()
        self.broker.heartbeat_worker(self.worker_id)
        if not owned:
            return
        alive = self.broker.renew(self.worker_id, [(i, a) for i, a, _ in owned], self.lease)
        for task_id, attempt, token in owned:
            if task_id not in alive:
                self.on_lost(task_id, attempt, token)
            elif alive[task_id]:
                self.on_cancel(task_id)
        log.debug("lease.renewed", count=len(alive))
        self.metrics.leases_renewed(len(alive))
