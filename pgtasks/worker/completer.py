"""Batched, fenced finalisation.

Outcomes queue up here from the pool; one thread writes them in batches (one statement per kind
per batch). A database error keeps the batch and tries again with backoff, so an outcome is
never dropped by the worker itself; a row the worker no longer owns is discarded and logged
(``lease.lost``).
"""

from __future__ import annotations

import contextlib
import queue
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, Union

import psycopg
import structlog

from pgtasks.broker import Broker, Row
from pgtasks.metrics import NullMetrics
from pgtasks.records import Failure, Plan, Release, RetryAt, Success

Final = Union[Success, Failure, RetryAt, Release]  # noqa: UP007 - a runtime alias on 3.10
Conn = psycopg.Connection[Any] | None
Writer = Callable[[str, list[Any], Conn], dict[str, str]]
log = structlog.get_logger("pgtasks")


class Completer(threading.Thread):
    """Writes final states for one worker."""

    def __init__(
        self,
        broker: Broker,
        worker_id: str,
        on_written: Callable[[Final, str | None], None],
        max_batch: int = 1000,
        linger: float = 0.002,
        busy_linger: float = 0.025,
    ) -> None:
        super().__init__(name="pgtasks-completer", daemon=True)
        self.broker = broker
        self.worker_id = worker_id
        self.on_written = on_written
        self.max_batch = max_batch
        # How long an outcome waits for others to share its statement: a few milliseconds
        # turn a busy worker's one-row writes into batches of tens of rows. While claimed
        # tasks wait to start (``busy``), it waits longer: the next task is already there, so
        # the wait delays no start, and each statement (and its commit's WAL flush) is shared
        # by several times more rows. 25 ms gives a worker that runs a few thousand tasks a
        # second batches of about sixty: in the side-by-side burn-down this cut the server's
        # CPU a task by about a tenth against 10 ms (batches of about thirty); 50 ms gained
        # nothing more.
        self.linger = linger
        self.busy_linger = busy_linger
        self.busy: Callable[[], bool] | None = None
        # Builds a chord's body when its last member finishes (set by the worker, which has
        # the app to decode results with); batches carrying canvas follow-ups need it.
        self.chord_ready: Callable[[Row, list[Row]], Plan] | None = None
        self.metrics: NullMetrics = NullMetrics()
        # False: successes delete their rows (finished_task_retention = 0, see Broker.complete).
        self.keep_finished = True
        self._queue: queue.SimpleQueue[Final | None] = queue.SimpleQueue()
        self._stop_requested = threading.Event()
        self.pending = 0
        self._lock = threading.Lock()
        # The thread's own connection (see Broker.completion_connection), opened on first use
        # and again after it broke; None behind PgBouncer, where the pool's connections serve.
        self._conn: psycopg.Connection[Any] | None = None

    def put(self, item: Final) -> None:
        with self._lock:
            self.pending += 1
        self._queue.put(item)

    def stop(self, timeout: float | None = None) -> None:
        """Write everything queued, then stop."""
        self._stop_requested.set()
        self._queue.put(None)
        self.join(timeout)

    def run(self) -> None:
        try:
            self._run()
        finally:
            self._close()

    def _connection(self) -> psycopg.Connection[Any] | None:
        if not self.broker.own_connections:
            return None
        if self._conn is None or self._conn.closed:
            self._conn = self.broker.completion_connection()
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(psycopg.Error):
                conn.close()

    def _run(self) -> None:
        while True:
            try:
                first = self._queue.get(timeout=0.5)
            except queue.Empty:
                if self._stop_requested.is_set():
                    return
                continue
            batch: list[Final] = [] if first is None else [first]
            if first is not None and not self._stop_requested.is_set():
                busy = self.busy is not None and self.busy()
                linger = self.busy_linger if busy else self.linger
                if linger > 0:
                    time.sleep(linger)
            while len(batch) < self.max_batch:
                try:
                    item = self._queue.get_nowait()
                except queue.Empty:
                    break
                if item is not None:
                    batch.append(item)
            if batch:
                self._write(batch)
            if first is None and self._stop_requested.is_set() and self._queue.empty():
                return

    def _write(self, batch: Sequence[Final]) -> None:
        groups: dict[type, list[Any]] = {}
        for item in batch:
            groups.setdefault(type(item), []).append(item)
        for kind, items in groups.items():
            try:
                statuses = self._with_retries(kind, items)
            except Exception:
                # Never let this thread die. The rows are forgotten here, so their leases are
                # no longer renewed: they run out and the reclaimer hands the tasks on.
                log.exception("worker.loop_error", during="finalise", dropped=len(items))
                self.metrics.loop_error("finalise")
                statuses = {}
            for item in items:
                self.on_written(item, statuses.get(item.id))
            with self._lock:
                self.pending -= len(items)

    def _with_retries(self, kind: type, items: list[Any]) -> dict[str, str]:
        keep = self.keep_finished

        def complete(worker: str, batch: list[Any], conn: Conn) -> dict[str, str]:
            return self.broker.complete(worker, batch, conn, keep)

        writers: dict[type, Writer] = {
            Success: complete,
            Failure: self.broker.fail,
            RetryAt: self.broker.retry,
            Release: self.broker.release,
        }
        write = writers[kind]
        chord_ready = self.chord_ready
        if chord_ready is not None and any(getattr(i, "followups", None) for i in items):
            # Follow-ups are written in the transaction of the fenced outcome (on a pooled
            # connection: the transaction spans several statements).
            def write(worker: str, batch: list[Any], conn: Conn) -> dict[str, str]:
                assert chord_ready is not None
                return self.broker.finalise(worker, batch, chord_ready, keep)

        delay = 0.1
        while True:
            try:
                conn = self._connection()
                try:
                    return write(self.worker_id, items, conn)
                except psycopg.OperationalError:
                    raise
                except psycopg.Error as exc:
                    # One bad outcome must not block the batch: write them one by one.
                    log.error("worker.loop_error", during="finalise", error=str(exc).strip())
                    self.metrics.loop_error("finalise")
                    return self._one_by_one(write, items, conn)
            except psycopg.OperationalError as exc:
                # The next attempt opens a new connection where this one broke.
                if self._conn is not None and self._conn.broken:
                    self._close()
                log.warning(
                    "worker.db_unavailable",
                    during="finalise",
                    error=str(exc).strip(),
                    retry_in=round(delay, 2),
                    waiting=len(items),
                )
                time.sleep(delay)
                delay = min(delay * 2, 5.0)

    def _one_by_one(self, write: Writer, items: list[Any], conn: Conn) -> dict[str, str]:
        statuses: dict[str, str] = {}
        for item in items:
            try:
                statuses.update(write(self.worker_id, [item], conn))
                continue
            except psycopg.OperationalError:
                raise
            except psycopg.Error as exc:
                reason = f"the outcome could not be recorded: {str(exc).strip()}"
            log.error("task.failed", task_id=item.id, attempt=item.attempt, error=reason)
            try:
                fallback = Failure(
                    item.id,
                    item.attempt,
                    "FAILED",
                    reason,
                    None,
                    False,
                    "application/json",
                    None,
                    None,
                )
                statuses.update(self.broker.fail(self.worker_id, [fallback]))
            except psycopg.Error as exc:
                # Left RUNNING: its lease runs out and the reclaimer hands it to another worker.
                log.error(
                    "worker.loop_error", during="finalise", task_id=item.id, error=str(exc).strip()
                )
                self.metrics.loop_error("finalise")
        return statuses
