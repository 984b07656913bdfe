"""The worker's claims: the statement that takes due rows, on the connection the worker keeps
for it, with what it needs to know (the rate-limited tasks, the priority floors claims start
from once full claims are slow) and what it learns (how far to read past rows waiting for a
rate limit, whether claims are slow)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks import ratelimits
from pgtasks.message import ClaimedTask
from pgtasks.states import Status
from pgtasks.worker.floors import Floors

if TYPE_CHECKING:
    from pgtasks.app import Celery


class Claims:
    """One worker's claims of rows in its queues, by the loop and, for the rows a hand-off
    names, by the listener's thread; each holds the claim connection while it runs."""

    def __init__(
        self,
        app: Celery,
        worker_id: str,
        queues: list[str],
        lease: float,
        wake: threading.Event,
        log: Any,
    ) -> None:
        self._app = app
        self._settings = app.settings
        self._id = worker_id
        self._queues = queues
        self._lease = lease
        self._wake = wake
        self._log = log
        self._conn: psycopg.Connection[Any] | None = None
        # The claim connection is the loop's, and the listener's for the rows a hand-off names.
        self._lock = threading.Lock()
        #: Where claims start in each priority band once full claims are slow (see
        #: pgtasks.worker.floors); its gate says when.
        self.floors = Floors()
        # Registered tasks with a rate limit (see rate_intervals), for a registry of that size.
        self._rates: tuple[int, dict[str, float]] | None = None
        # How many due rows the next claim reads (0: as many as it claims); see claim.
        self._scan = 0

    def claim(self, want: int, debug: bool = False) -> tuple[list[ClaimedTask], int]:
        """Claim up to ``want`` rows, on the worker's claim connection where there is one
        (see Broker.claim_connection); with how many the claim took, blocked ones included.
        ``debug``: log the rows left waiting for a rate limit."""
        broker = self._app.broker
        floors = self.floors
        plan = floors.plan(self._queues)
        rates = self.rate_intervals()
        with self._connection() as conn:
            started = time.perf_counter()
            rows = broker.claim_all(
                self._id, self._queues, want, self._lease, conn, plan, rates, self._scan
            )
            elapsed = time.perf_counter() - started
        claimed = [row for row in rows if row.set_aside is None]
        waiting = [row for row in rows if row.set_aside == Status.PENDING] if rates else []
        # Rows waiting for a rate limit's start time: read further next time, so that a
        # backlog of them leaves the due rows in a few claims.
        self._scan = min(1000, max(self._scan, want) * 4) if waiting else 0
        if debug:
            for row in waiting:
                self._log.debug(
                    "task.rate_limited", task_id=row.id, task_name=row.name, eta=row.run_at
                )
        was_active = floors.active
        floors.record(plan, claimed, elapsed, time.monotonic())
        if floors.active != was_active:
            claim_ms = round(elapsed * 1000, 1)
            if floors.active:
                self._log.info(
                    "worker.claim_floors",
                    state="on",
                    claim_ms=claim_ms,
                    hint="full claims are slow, as when a long transaction holds back vacuum: "
                    "claims start where this worker's last ones ended, with a full claim now "
                    "and then (see docs/operating.md)",
                )
            else:
                self._log.info("worker.claim_floors", state="off", claim_ms=claim_ms)
        return claimed, len(rows)

    def claim_handed(self, ids: list[str]) -> list[ClaimedTask]:
        """Claim the rows a hand-off names, those of them that can start here now (see
        Broker.claim_handed)."""
        with self._connection() as conn:
            return self._app.broker.claim_handed(
                self._id, ids, self._queues, self._lease, conn, self.rate_intervals()
            )

    def rate_intervals(self) -> dict[str, float]:
        """Each registered task with a rate limit, and the seconds between its starts: the
        claim holds those tasks to their start times (see pgtasks.ratelimits)."""
        if self._settings.disable_rate_limits:
            return {}
        tasks = self._app.tasks
        if self._rates is None or self._rates[0] != len(tasks):
            rates: dict[str, float] = {}
            for name, task in list(tasks.items()):
                try:
                    every = self._interval(task)
                except (TypeError, ValueError) as exc:
                    # Checked when the task is defined; a value set on it since is not held.
                    self._log.error(
                        "worker.loop_error", during="rate limit", task_name=name, error=str(exc)
                    )
                    continue
                if every is not None:
                    rates[name] = every
            self._rates = (len(tasks), rates)
        return self._rates[1]

    def _interval(self, task: Any) -> float | None:
        limit = task.rate_limit
        if limit is None:
            limit = self._settings.default_rate_limit
        return ratelimits.interval(limit)

    def probe_floors(self) -> None:
        """While claims start from floors, look for due rows behind them now and then (see
        pgtasks.worker.floors); on the maintenance thread, off the claim path. Rows found
        behind wake the worker."""
        floors = self.floors
        plan = floors.probe_plan(self._queues, time.monotonic())
        if plan is None:
            return
        started = time.perf_counter()
        behind = self._app.broker.behind_floors(plan)
        elapsed = time.perf_counter() - started
        floors.probe_done(behind, elapsed, time.monotonic())
        if not floors.active:
            self._log.info("worker.claim_floors", state="off", probe_ms=round(elapsed * 1000, 1))
        if behind:
            self._wake.set()

    @contextlib.contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any] | None]:
        """The claim connection (see Broker.claim_connection), held for one claim; None where
        the broker keeps no connections of its own (claims then take the pool's). A broken
        connection is closed, and the next claim opens a new one."""
        broker = self._app.broker
        with self._lock:
            conn = None
            if broker.own_connections:
                conn = self._conn
                if conn is None or conn.closed:
                    conn = self._conn = broker.claim_connection()
            try:
                yield conn
            except psycopg.OperationalError:
                if conn is not None:
                    with contextlib.suppress(psycopg.Error):
                        conn.close()
                    self._conn = None
                raise

    def close(self) -> None:
        """Close the claim connection (the worker stopped)."""
        if self._conn is not None:
            with contextlib.suppress(psycopg.Error):
                self._conn.close()
