"""Cancels: what a worker does when a task it holds was revoked.

A revoke reaches the worker two ways: a notification on the cancel channel (quick, but only a
hint that anyone who can connect could send: the worker reads the row before it acts), and the
lease renewal, which reads cancel_requested of every row it renews (the fallback for a lost
notification). Either marks the claim revoked in the in-flight book, once: a call that has not
started is then discarded when its slot frees up, and a running one sees request.cancelled,
and with ``revoke(terminate=True)`` its process is stopped where the pool can."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

import psycopg

from pgtasks import utils
from pgtasks.worker.inflight import InFlightBook
from pgtasks.worker.pools import Pool

if TYPE_CHECKING:
    from pgtasks.app import Celery


class Cancels:
    """Revokes of the tasks one worker holds: flagged in its in-flight book (under the
    worker's lock), and a running call terminated where asked and the pool can."""

    def __init__(
        self,
        app: Celery,
        worker_id: str,
        pool: Pool,
        inflight: InFlightBook,
        lock: threading.Lock,
        log: Any,
    ) -> None:
        self._app = app
        self._id = worker_id
        self._pool = pool
        self._inflight = inflight
        self._lock = lock
        self._log = log

    def renewed(self, task_id: str) -> None:
        """A renewal found ``task_id`` revoked (the fallback for a lost notification)."""
        if self.flag(task_id, "renewal"):
            signal_name = self._app.broker.revoke_signal(task_id)
            if signal_name:
                self.terminate(task_id, signal_name)

    def notified(self, task_id: str, signal_name: str | None) -> None:
        """The cancel channel says ``task_id`` was revoked (for whichever worker runs it). A
        notification is only a hint, which any role that can connect could send: the row
        decides whether the task was revoked, and with which signal (``signal_name``, what
        the notification says, is not used)."""
        with self._lock:
            entry = self._inflight.get(task_id)
            if entry is None or entry.cancel_requested or entry.finishing:
                return
            attempt = entry.task.attempt
        try:
            revoked, stored = self._app.broker.cancel_state(self._id, task_id, attempt)
        except psycopg.Error as exc:
            # The next renewal reads the same row.
            self._log.warning("worker.db_unavailable", during="cancel", error=str(exc).strip())
            return
        if not revoked:
            self._log.warning(
                "worker.cancel_ignored",
                task_id=task_id,
                reason="a notification said the task was revoked; its row does not",
            )
            return
        if self.flag(task_id, "notify") and stored:
            self.terminate(task_id, stored)

    def flag(self, task_id: str, via: str) -> bool:
        """Mark a running task revoked; True the first time (it runs here, not finished)."""
        with self._lock:
            entry = self._inflight.get(task_id)
            if entry is None or entry.cancel_requested or entry.finishing:
                return False
            entry.cancel_requested = True
        self._log.info("task.cancel_requested", task_id=task_id, via=via)
        return True

    def terminate(self, task_id: str, signal_name: str) -> None:
        """``revoke(terminate=True)``: stop the task's process where the pool has one."""
        try:
            signum = utils.parse_signal(signal_name)
        except ValueError as exc:
            self._log.warning("task.terminate_refused", task_id=task_id, error=str(exc))
            return
        with self._lock:
            entry = self._inflight.get(task_id)
            if entry is not None:
                if not entry.running:
                    # Still waiting for its slot: the worker discards it before it runs.
                    return
                entry.terminated = signum
        if not self._pool.terminate(task_id, signum):
            with self._lock:
                if entry is not None:
                    entry.terminated = None
            self._log.warning(
                "task.terminate_unsupported",
                task_id=task_id,
                pool=self._pool.name,
                hint="only the prefork pool (and the asyncio pool, for async def tasks) can "
                "stop a running task; here it runs to its end, cannot record success, and sees "
                "request.cancelled",
            )
