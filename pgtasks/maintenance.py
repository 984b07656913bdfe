"""Small services any worker may run, safe to run on all of them at once.

- ``Reclaimer``: takes back expired leases (crashed or cut-off workers), logging the previous
  owner; a task that has lost too many workers is dead-lettered ("worker lost"), never looped,
  and counted by its chord, if it belongs to one.
- ``Pruner``: retention for finished rows and results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import psycopg
import structlog

from pgtasks.broker import Broker, Plan, Row
from pgtasks.metrics import NullMetrics

log = structlog.get_logger("pgtasks")


class Reclaimer:
    def __init__(
        self,
        broker: Broker,
        max_lost: int,
        chord_ready: Callable[[Row, list[Row]], Plan] | None = None,
    ) -> None:
        self.broker = broker
        self.max_lost = max_lost
        self.chord_ready = chord_ready
        self.metrics: NullMetrics = NullMetrics()

    def run_once(self) -> int:
        rows = self.broker.reclaim(self.max_lost, chord_ready=self.chord_ready)
        if rows:
            self.metrics.reclaimed(len(rows), sum(r["status"] == "DEAD" for r in rows))
        for row in rows:
            event = "task.dead_lettered" if row["status"] == "DEAD" else "lease.reclaimed"
            log.warning(
                event,
                task_id=row["id"],
                task_name=row["name"],
                queue=row["queue"],
                previous_owner=row["previous_owner"],
                attempt=row["attempt"],
                retries=row["retries"],
                status=row["status"],
                reason="worker lost" if row["status"] == "DEAD" else "lease expired",
            )
        return len(rows)


class Pruner:
    def __init__(self, broker: Broker, task_age: float, result_age: float) -> None:
        self.broker = broker
        self.task_age = task_age
        self.result_age = result_age

    #: Rows of each kind one statement deletes: small, so that each statement holds a core only
    #: for milliseconds and a busy queue's claims and completions never wait behind it.
    BATCH = 1000
    #: Statements one pass may run before yielding to the next reclaim (a backlog is worked off
    #: over the following passes).
    MAX_BATCHES = 50

    def run_once(self) -> tuple[int, int]:
        """Delete what is past retention, batch after batch while batches come back full."""
        tasks = results = 0
        for _ in range(self.MAX_BATCHES):
            t, r = self.broker.prune(self.task_age, self.result_age, self.BATCH)
            tasks += t
            results += r
            if t < self.BATCH and r < self.BATCH:
                break
        if tasks or results:
            log.debug("maintenance.pruned", tasks=tasks, results=results)
        return tasks, results


class Maintenance(threading.Thread):
    """Runs the reclaimer every ``interval`` seconds and the pruner every PRUNE_EVERY seconds.

    The pruner runs every second so that each pass deletes about a second's worth of finished
    rows: on a busy queue, ten seconds' worth deleted at once is a burst of database work that
    shows as a latency spike for every task sent meanwhile.
    """

    PRUNE_EVERY = 1.0

    def __init__(self, reclaimer: Reclaimer, pruner: Pruner, interval: float) -> None:
        super().__init__(name="pgtasks-maintenance", daemon=True)
        self.reclaimer = reclaimer
        self.pruner = pruner
        self.interval = interval
        self.stopped = threading.Event()

    def stop(self) -> None:
        self.stopped.set()

    def run(self) -> None:
        next_reclaim = time.monotonic() + self.interval
        next_prune = time.monotonic() + self.PRUNE_EVERY
        while not self.stopped.wait(max(0.0, min(next_reclaim, next_prune) - time.monotonic())):
            now = time.monotonic()
            try:
                if now >= next_reclaim:
                    next_reclaim = now + self.interval
                    self.reclaimer.run_once()
                if now >= next_prune:
                    next_prune = now + self.PRUNE_EVERY
                    self.pruner.run_once()
            except psycopg.OperationalError as exc:
                log.warning("worker.db_unavailable", during="maintenance", error=str(exc).strip())
            except Exception:
                log.exception("worker.loop_error", during="maintenance")
                self.reclaimer.metrics.loop_error("maintenance")
