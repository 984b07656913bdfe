"""Small services any worker may run, safe to run on all of them at once.

- ``Reclaimer``: takes back expired leases (crashed or cut-off workers), logging the previous
  owner; a task that has lost too many workers is dead-lettered ("worker lost"), never looped,
  and counted by its chord, if it belongs to one. It also moves on rows blocked by a
  concurrency limit whose key has room (a worker killed between ending a limited task and
  moving its key's blocked rows leaves them so), forgets the counts of idle keys, and the
  waits of workers killed while parked.
- ``Pruner``: retention for finished rows and results.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import psycopg
import structlog

from pgtasks.broker import Broker, Row
from pgtasks.metrics import NullMetrics
from pgtasks.records import Plan
from pgtasks.worker.floors import Gate

log = structlog.get_logger("pgtasks")


class Reclaimer:
    """Takes back expired leases.

    The lease index keeps an entry for every lease a row has had until vacuum removes it. While
    a long transaction elsewhere holds vacuum back, a call that reads the index from its oldest
    entry gets slower with every lease since; once a full call is slow (see ``Gate``), calls
    start where the last one that caught up ended, less ``FLOOR_MARGIN`` (a lease committed
    later than that behind its own time is found by the next full call). A call that comes back
    full (a backlog: many workers lost at once) is followed by one that starts at the last
    lease it took back, full or not, so a backlog is read once, not once per batch.

    A call has caught up only as far as the oldest expired lease it left RUNNING: a row that
    another transaction held as the call passed (``SKIP LOCKED``: a reclaim elsewhere, a
    renewal, an outcome write) may be free again with its lease still expired, that
    transaction having rolled back with a killed worker or a restarted server. The next floor
    is never past such a lease, so the next call takes the row rather than the next full one,
    which may be minutes away.
    """

    FLOOR_MARGIN = timedelta(seconds=2)
    BATCH = 1000
    #: Seconds from one full call to the next at most, however slow the last one was.
    MAX_FULL_EVERY = 60.0

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
        # A lease behind the floor (committed later than the margin behind its own time, or
        # set back by hand) is taken back by a full call: one at least every minute.
        self.gate = Gate(slow=0.05, min_full_every=10.0, max_full_every=self.MAX_FULL_EVERY)
        self._floor: datetime | None = None
        #: The last call came back full: the next goes on from its floor.
        self._backlog = False

    def run_once(self) -> int:
        started = time.monotonic()
        full = self.gate.full_due(started) and not self._backlog
        rows, cutoff = self.broker.reclaim_from(
            None if full else self._floor, self.max_lost, self.BATCH, chord_ready=self.chord_ready
        )
        if full:
            self.gate.full_done(time.monotonic() - started, time.monotonic())
        # ``cutoff``: every lease from the floor up to it has been taken back (see
        # Broker.reclaim_from); a lease left expired keeps it, and so the next floor, behind it.
        if len(rows) < self.BATCH:
            self._floor = cutoff - self.FLOOR_MARGIN
            self._backlog = False
        else:
            self._floor = min(max(row["expired_at"] for row in rows), cutoff)
            self._backlog = True
        self._unblock()
        self.broker.prune_parked_workers(self.BATCH)
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

    def _unblock(self) -> None:
        """Move on blocked rows whose key has room, a batch of keys at a time."""
        after = ""
        moved = 0
        while True:
            keys = self.broker.blocked_keys(after, self.BATCH)
            if keys:
                moved += self.broker.unblock(keys)
            if len(keys) < self.BATCH:
                break
            after = keys[-1]
        if moved:
            log.info("concurrency.unblocked", tasks=moved, reason="key had room")
        self.broker.prune_concurrency_limits(self.BATCH)


class Pruner:
    """Retention, batch by batch.

    While a long transaction elsewhere holds vacuum back, the entries of every row deleted since
    stay in the retention indexes, and a statement that reads them from the oldest entry visits
    them all again. Once a full pass's first statement is slow (see ``Gate``), passes start where
    the last one that caught up ended, less ``FLOOR_MARGIN`` (a row committed later than that
    behind its own timestamp is taken by the next full pass).

    Within a pass, and from one pass to the next while a backlog lasts, a statement starts
    where the last full one stopped (rows are deleted oldest first): only a full pass's first
    statement reads from the oldest entry, so a backlog costs its own size, not its size times
    everything the held snapshot keeps.
    """

    FLOOR_MARGIN = timedelta(seconds=2)

    def __init__(self, broker: Broker, task_age: float, result_age: float) -> None:
        self.broker = broker
        self.task_age = task_age
        self.result_age = result_age
        self.gate = Gate(slow=0.1, min_full_every=10.0)
        self._floors: tuple[datetime | None, datetime | None] = (None, None)
        #: The last statement came back full: the next pass goes on from the floors.
        self._backlog = False

    #: Rows of each kind one statement deletes: small, so that each statement holds a core only
    #: for milliseconds and a busy queue's claims and completions never wait behind it.
    BATCH = 1000
    #: Statements one pass may run before yielding to the next reclaim (a backlog is worked off
    #: over the following passes).
    MAX_BATCHES = 50

    def run_once(self) -> tuple[int, int]:
        """Delete what is past retention, batch after batch while batches come back full."""
        started = time.monotonic()
        full = self.gate.full_due(started) and not self._backlog
        floors = (None, None) if full else self._floors
        tasks = results = 0
        for i in range(self.MAX_BATCHES):
            p = self.broker.prune(self.task_age, self.result_age, self.BATCH, floors)
            if full and i == 0:
                self.gate.full_done(time.monotonic() - started, time.monotonic())
            tasks += p.tasks
            results += p.results
            # A kind whose batch came back short is done up to its cutoff: the next pass can
            # start there. One whose batch came back full goes on from its newest deleted row.
            floors = (
                self._next_floor(p.tasks, p.task_cutoff, p.task_last),
                self._next_floor(p.results, p.result_cutoff, p.result_last),
            )
            self._floors = floors
            self._backlog = p.tasks >= self.BATCH or p.results >= self.BATCH
            if not self._backlog:
                break
        if tasks or results:
            log.debug("maintenance.pruned", tasks=tasks, results=results)
        return tasks, results

    def _next_floor(self, deleted: int, cutoff: datetime, last: datetime | None) -> datetime | None:
        # A full batch deleted rows, so ``last`` is set then.
        return cutoff - self.FLOOR_MARGIN if deleted < self.BATCH else last


class Maintenance(threading.Thread):
    """Runs the reclaimer every ``interval`` seconds and the pruner every PRUNE_EVERY seconds.

    The pruner runs every second so that each pass deletes about a second's worth of finished
    rows: on a busy queue, ten seconds' worth deleted at once is a burst of database work that
    shows as a latency spike for every task sent meanwhile.
    """

    PRUNE_EVERY = 1.0

    def __init__(
        self,
        reclaimer: Reclaimer,
        pruner: Pruner,
        interval: float,
        probe: Callable[[], None] | None = None,
    ) -> None:
        super().__init__(name="pgtasks-maintenance", daemon=True)
        self.reclaimer = reclaimer
        self.pruner = pruner
        self.interval = interval
        #: Called after each reclaim or prune (the worker's look behind its claim floors).
        self.probe = probe
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
                if self.probe is not None:
                    self.probe()
            except psycopg.OperationalError as exc:
                log.warning("worker.db_unavailable", during="maintenance", error=str(exc).strip())
            except Exception:
                log.exception("worker.loop_error", during="maintenance")
                self.reclaimer.metrics.loop_error("maintenance")
