"""``Worker.run`` reads top to bottom: check the schema, start the pool and the helper threads,
claim and dispatch until told to stop, then shut down warm (or cold on a second signal)."""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import socket
import threading
import time
import uuid
from collections import deque
from typing import TYPE_CHECKING, Any

import psycopg
import structlog

from pgtasks import signals
from pgtasks.broker import handed_ids, handoff_channel
from pgtasks.canvas import register_builtins
from pgtasks.maintenance import Maintenance, Pruner, Reclaimer
from pgtasks.message import OVERSIZE_PAYLOAD, ClaimedTask, malformed
from pgtasks.metrics import NullMetrics
from pgtasks.metrics import create as create_metrics
from pgtasks.records import Release
from pgtasks.scheduler import BeatService, Scheduler
from pgtasks.serialization import DecodeError
from pgtasks.states import Status
from pgtasks.utils.signal_relay import SignalRelay
from pgtasks.worker import execute as ex
from pgtasks.worker import intake, outcomes, startup, task_signals
from pgtasks.worker.cancels import Cancels
from pgtasks.worker.claims import Claims
from pgtasks.worker.completer import Completer, Final
from pgtasks.worker.followups import chord_body_builder
from pgtasks.worker.inflight import InFlightBook
from pgtasks.worker.lease import LeaseKeeper
from pgtasks.worker.listener import Listener, RunHere
from pgtasks.worker.parking import Parking
from pgtasks.worker.pools import ThreadPool
from pgtasks.worker.pools import create as create_pool
from pgtasks.worker.prefetch import AdaptivePrefetch
from pgtasks.worker.tasklog import TaskLog, log_enabled

if TYPE_CHECKING:
    from pgtasks.app import Celery

log = structlog.get_logger("pgtasks")


class Worker:
    """One ``pgtasks worker`` process."""

    #: Seconds a starting worker waits for its listener to listen before it first claims.
    LISTEN_FIRST_WAIT = 2.0

    def __init__(
        self,
        app: Celery,
        *,
        queues: list[str] | None = None,
        concurrency: int | None = None,
        pool: str = "prefork",
        worker_id: str | None = None,
        lease: float | None = None,
        poll_interval: float | None = None,
        listen: bool | None = None,
        migrate: bool = False,
        burst: bool = False,
        shutdown_grace: float | None = None,
        prefetch_multiplier: int | None = None,
        time_limit: float | None = None,
        soft_time_limit: float | None = None,
        max_tasks_per_child: int | None = None,
        max_memory_per_child: int | None = None,
        beat: bool = False,
        metrics_port: int | None = None,
        freeze_gc: bool = False,
    ) -> None:
        s = app.settings
        self.app = app
        # Read once: the settings cannot change under a running worker, and the per-row
        # paths below use them.
        self.settings = s
        self.queues = queues or [s.default_queue]
        #: Calls in flight at once: CPUs by default, or 100 on the asyncio pool, whose calls
        #: mostly wait on I/O.
        default = 100 if pool == "asyncio" else os.cpu_count() or 1
        self.concurrency = concurrency or s.concurrency or default
        self.pool_name = pool
        self.hostname = socket.gethostname()
        self.id = worker_id or f"{self.hostname}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.lease = lease or s.lease_seconds
        self.poll_interval = poll_interval or s.poll_interval
        self.listen = s.listen_notify if listen is None else listen
        self.migrate = migrate
        self.burst = burst
        #: Also run the periodic task scheduler (``-B``); safe on every worker at once.
        self.beat = beat
        self.metrics_port = metrics_port
        #: Freeze what exists at start (see run): for a worker that owns its process, as
        #: ``pgtasks worker`` does. An embedded one would keep its host's objects uncollected.
        self.freeze_gc = freeze_gc
        self.metrics: NullMetrics = NullMetrics()
        self.shutdown_grace = s.shutdown_grace if shutdown_grace is None else shutdown_grace
        # The worker's defaults; a task's own option or a call's apply_async() limits win.
        self.time_limit = time_limit or s.task_time_limit
        self.soft_time_limit = soft_time_limit or s.task_soft_time_limit
        self.max_tasks_per_child = max_tasks_per_child or s.max_tasks_per_child
        #: KiB (Celery's unit); None given here means the setting's, 0 no limit (as Celery's).
        self.max_memory_per_child = (
            s.max_memory_per_child if max_memory_per_child is None else max_memory_per_child
        )
        multiplier = prefetch_multiplier or s.prefetch_multiplier
        # Rows claimed beyond the free slots wait here, leases renewed, until a slot frees up.
        # A fixed multiplier sets the buffer; by default it is sized to hold about
        # prefetch_window seconds of work at the tasks' measured run time, so short tasks are
        # claimed many per statement while long ones are never hoarded.
        self.fixed_prefetch = multiplier > 1
        self.prefetch_extra = self.concurrency * max(0, multiplier - 1)
        #: Sizes the adaptive buffer from the run times of the calls that ended.
        self.prefetch = AdaptivePrefetch(self.concurrency, s.prefetch_window)
        self._buffer: deque[ex.Job] = deque()
        self.log = log.bind(worker_id=self.id)
        self._read_levels()
        self._inflight = InFlightBook()
        self._backpressure = False
        self._lock = threading.Lock()
        self._wake = threading.Event()
        #: The worker's claims, on its claim connection.
        self.claims = Claims(app, self.id, self.queues, self.lease, self._wake, self.log)
        #: Where claims start in each priority band once full claims are slow (see
        #: pgtasks.worker.floors); its gate says when.
        self.floors = self.claims.floors
        self._stopping = threading.Event()
        self._cold = threading.Event()
        # Direct hand-off (see Broker.park): hand-offs reach this worker only while its
        # listener listens.
        self.handoff = self.listen and s.handoff and not burst
        #: This worker's park in parked_workers, and the hand-offs it brought.
        self.parking = Parking(
            app,
            self.id,
            self.queues,
            self.lease,
            poll_interval=self.poll_interval,
            handoff=self.handoff,
            log=self.log,
        )
        self.ready = threading.Event()
        self.processed = 0

    # -- the run -------------------------------------------------------------------------------

    def run(self) -> None:
        """Run until stopped by a signal, ``stop()``, or (``burst``) an empty queue."""
        app, s = self.app, self.app.settings
        signals.celeryd_init.send(sender=self.hostname, instance=self, conf=app.conf, options={})
        app.import_includes()
        app.finalize()
        register_builtins(app)  # map, starmap and chunks run as Celery's built-in tasks
        startup.prepare_schema(app, self.migrate, self.log)
        signals.celeryd_after_setup.send(sender=self.hostname, instance=self, conf=app.conf)
        broker = app.broker
        broker.min_size = max(broker.min_size, 4)
        broker.register_worker(self.id, self.hostname, os.getpid(), self.queues, self.concurrency)
        broker.announce_tasks(self.id, app.registered())

        signals.worker_init.send(sender=self)
        # worker_init receivers may have configured logging.
        self._read_levels()
        self.metrics = create_metrics(self.id, broker, self.metrics_port, self.lease)
        self.pool = create_pool(
            self.pool_name,
            app,
            self.concurrency,
            self.max_tasks_per_child,
            max_memory_per_child=self.max_memory_per_child,
            worker_id=self.id,
        )
        self.pool.on_start = self._started
        self.cancels = Cancels(app, self.id, self.pool, self._inflight, self._lock, self.log)
        startup.warn_unenforced_limits(app, self.pool.name, self.time_limit, self.log)
        startup.warn_autovacuum_off(app, self.log)
        if self.freeze_gc:
            # Modules, tasks and settings live as long as the worker. Frozen, they are left
            # out of every collection: a full one walks only what the worker made since
            # (milliseconds, not the tens of milliseconds that stop every task thread of a
            # large app), and prefork children keep sharing those pages with the worker
            # instead of copying the ones a collection writes to.
            gc.collect()
            gc.freeze()
        self.pool.start()  # before any thread starts: prefork children are forked here
        self.completer = Completer(broker, self.id, self._written)
        self.completer.chord_ready = chord_body_builder(app)
        self.completer.busy = self._has_backlog
        self.completer.metrics = self.metrics
        self.completer.keep_finished = s.finished_task_retention > 0
        self.leases = LeaseKeeper(
            broker, self.id, self.lease, self._owned, self._lost, self.cancels.renewed
        )
        self.leases.metrics = self.metrics
        reclaimer = Reclaimer(broker, s.max_lost_attempts, self.completer.chord_ready)
        reclaimer.metrics = self.metrics
        self.maintenance = Maintenance(
            reclaimer,
            Pruner(broker, s.finished_task_retention, s.result_expires),
            interval=min(max(self.lease / 3.0, 0.2), 10.0),
            probe=self.claims.probe_floors,
        )
        threads: list[Any] = [self.completer, self.leases, self.maintenance]
        if self.beat:
            threads.append(BeatService(Scheduler(app)))
        if self.listen:
            self.listener = Listener(
                broker,
                set(self.queues),
                self._wake,
                on_cancel=self.cancels.notified,
                handoffs=handoff_channel(broker.schema, self.id) if self.handoff else None,
                on_handoff=self._handed,
                on_listening=self._on_listening,
                # A handed-off task runs on the listener's thread that heard of it, in one of
                # the pool's slots: no pool thread to wake before it starts.
                runs_tasks=(
                    self.pool.thread_context
                    if self.handoff
                    and isinstance(self.pool, ThreadPool)
                    and self.pool.runs_elsewhere
                    else None
                ),
            )
            threads.append(self.listener)
        for thread in threads:
            thread.start()
        if self.listen:
            # A revoke sent before the listener listens is heard only at the next renewal
            # (a third of the lease): claim nothing until it listens, unless it cannot
            # connect soon (the claims then meet the same trouble, and say so).
            self.parking.wait_listening(self.LISTEN_FIRST_WAIT)
        self._install_signals()
        self.log.info(
            "worker.started",
            queues=self.queues,
            concurrency=self.concurrency,
            pool=self.pool.name,
            lease=self.lease,
            handoff=self.handoff,
            tasks=app.registered(),
        )
        signals.worker_ready.send(sender=self)
        self.ready.set()
        try:
            self._loop()
        finally:
            self._shutdown(threads)

    def _read_levels(self) -> None:
        """Whether the worker's logger emits debug and info: read once (and again once
        worker_init receivers ran), not on every task."""
        self._debug = log_enabled(self.log, logging.DEBUG)
        self._levels = (self._debug, log_enabled(self.log, logging.INFO))

    def held(self) -> list[str]:
        """The ids of the tasks this worker holds a claim of, from the claim until the claim's
        final state is written (running, waiting for a slot, or being written)."""
        with self._lock:
            return list(self._inflight)

    @property
    def park_backoff(self) -> float:
        """Seconds an idle worker now waits before it parks again: each park given up unused
        (the worker claimed the usual way while parked) doubles it, up to a second; a hand-off,
        which shows parks are used, resets it to 0."""
        return self.parking.backoff

    def stop(self, cold: bool = False) -> None:
        """Stop claiming; finish what runs (warm) or stop now (cold)."""
        if cold:
            self._cold.set()
        self._stopping.set()
        self._wake.set()

    def _loop(self) -> None:
        backoff = 0.1
        # Whether the last claim set rows BLOCKED (over a concurrency limit): slots it meant
        # to fill are still free, so the next claim goes ahead however many jobs wait to start.
        blocked = False
        while not self._stopping.is_set():
            self._start_buffered()
            if not self.fixed_prefetch:
                self.prefetch_extra = self.prefetch.rows()
            want = self.pool.free_slots() + self.prefetch_extra - len(self._buffer)
            backlog = self._backlog()
            if backlog and backlog > self.prefetch_extra // 2 and not blocked:
                # Refill the prefetch buffer in batches (one claim for many rows), not row by row.
                want = 0
            self._backpressure = (
                self.completer.pending > self.concurrency + self.prefetch_extra + 100
            )
            if self._backpressure:
                # Outcomes are waiting to be written: claim nothing more until they are, so
                # finished rows never pile up RUNNING behind a slow database (the completer
                # wakes the loop as it catches up).
                want = 0
            if want <= 0:
                self._wake.wait(self.poll_interval)
                self._wake.clear()
                continue
            self._wake.clear()
            blocked = False
            try:
                claimed, taken = self.claims.claim(want, self._debug)
                blocked = taken > len(claimed)
                backoff = 0.1
                self.prefetch.claimed(want, taken)
            except psycopg.OperationalError as exc:
                self.log.warning(
                    "worker.db_unavailable",
                    during="claim",
                    error=str(exc).strip(),
                    retry_in=round(backoff, 2),
                )
                self._stopping.wait(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            except Exception:
                self.log.exception("worker.loop_error", during="claim")
                self.metrics.loop_error("claim")
                self._stopping.wait(1.0)
                continue
            for row in self._well_formed(claimed):
                job = self._accept(row)
                if job is not None:
                    self._buffer.append(job)
            self._start_buffered()
            if claimed:
                # Busy again: a task handed here now would wait behind these.
                self.parking.busy()
            if taken >= want:
                # Full (rows blocked by a concurrency limit included): more may be due.
                continue
            if self._burst_done(claimed):
                self.log.info("worker.idle", reason="burst mode: no task left in its queues")
                self._stopping.set()
                break
            if (
                not self._stopping.is_set()
                and self.pool.free_slots() > 0
                and self.parking.park(self.claims.rate_intervals, hand_off=not taken)
            ):
                # Enqueues that found no worker waiting as this one parked have committed:
                # claim once more for their rows (later ones notify).
                continue
            self._wake.wait(self.poll_interval)

    # -- direct hand-off -----------------------------------------------------------------------

    def _handed(self, payload: str, here: bool = False) -> RunHere | None:
        """A hand-off (on the listener's thread): an enqueue names a task it wrote for this
        worker. The notification is only a hint, which any role that can connect could send:
        the worker claims the rows it names in the database, as any claim does, and runs
        what that claim gave it. With ``here``, a task that can start at once is returned
        instead, to run on that thread."""
        run: RunHere | None = None
        self.parking.handed()
        ids = handed_ids(payload)
        if not ids:
            self.log.warning("worker.handoff_ignored", reason="not a list of task ids")
        elif not self._stopping.is_set():
            try:
                rows = self.claims.claim_handed(ids)
                if len(rows) < len(ids) and self._debug:
                    found = {row.id for row in rows}
                    self.log.debug(
                        "worker.handoff_not_claimed", tasks=[i for i in ids if i not in found]
                    )
                run = self._take(rows, here)
            except Exception as exc:
                # Nothing was claimed, or the rows' leases bring them back: late, never lost.
                self.log.error("worker.loop_error", during="hand-off", error=str(exc))
                self.metrics.loop_error("hand-off")
        if self.pool.free_slots() > 0:
            # Slots are still free: claim (and park again) for them. A worker whose slots
            # are all taken now claims when a task ends (see _done), not while this one
            # starts: it parked because nothing was due, and a claim now would only slow the
            # start (tasks enqueued since wake it as ever).
            self._wake.set()
        return run

    def _take(self, rows: list[ClaimedTask], here: bool = False) -> RunHere | None:
        """Start rows this worker was handed (or found it holds), each once; with ``here``,
        the first one that can start at once on the calling thread is returned to run
        there."""
        run: RunHere | None = None
        with self._lock:
            rows = [row for row in rows if not self._inflight.seen(row.id, row.attempt)]
        jobs: list[ex.Job] = []
        for row in self._well_formed(rows):
            if self._debug:
                self.log.debug("task.handed_off", task_id=row.id, task_name=row.name)
            job = self._accept(row)
            if job is not None:
                jobs.append(job)
        if here and jobs:
            run = self.pool.run_here(jobs[0], self._done)
            if run is not None:
                del jobs[0]
        if jobs:
            self.pool.submit_many(jobs, self._done)
        return run

    def _on_listening(self, listening: bool) -> None:
        """The listener (re)connected, or lost its connection: tasks handed here while it
        did not listen were never heard of, so they are looked up now, and no park is made
        while it cannot hear."""
        adopt = self.parking.listening_changed(listening)
        if not listening:
            return
        # Notifications (and hand-offs) can be heard now: an idle loop parks at once rather
        # than at its next poll (its last claim found nothing but could not park while nothing
        # listened).
        self._wake.set()
        if not adopt:
            return
        try:
            self._adopt()
        except Exception as exc:
            # On the listener's thread, which must go on listening: the rows' leases bring
            # them back if this fails.
            self.log.error("worker.loop_error", during="adopt", error=str(exc))
            self.metrics.loop_error("adopt")

    def _adopt(self) -> None:
        """Start (or, stopping, hand back) the RUNNING rows this worker holds unknowingly."""
        with self._lock:
            known = list(self._inflight)
        try:
            rows = self.app.broker.adopt(self.id, known)
        except psycopg.Error as exc:
            self.log.warning("worker.db_unavailable", during="adopt", error=str(exc).strip())
            return
        if rows:
            self.log.info("worker.adopted", tasks=[row.id for row in rows])
            self._take(rows)

    def _well_formed(self, claimed: list[ClaimedTask]) -> list[ClaimedTask]:
        """The claimed rows that can run as written (see pgtasks.message.malformed). Anyone
        who may insert a row writes every column of it: a row whose headers did not read or
        are not a JSON object of the types the worker reads, or whose payload is over
        max_payload_bytes, is dead-lettered here with the reason, before its payload is
        decoded, its columns kept for a requeue once mended; the rows beside it run."""
        limit = self.settings.max_payload_bytes
        kept: list[ClaimedTask] = []
        for row in claimed:
            problem = malformed(row, limit)
            if problem is None:
                kept.append(row)
            else:
                self._dead_letter_unread(row, *problem)
        return kept

    def _dead_letter_unread(self, row: ClaimedTask, reason: str, error: str) -> None:
        """Dead-letter a claimed row that will not be decoded (see _well_formed)."""
        with self._lock:
            if self._inflight.add(row) is None:
                return  # found twice (see _accept): settled as the first time
        TaskLog(self.log, row, self._levels).error("task.dead_lettered", reason=reason, error=error)
        self.metrics.dead_lettered(row.name, row.queue, reason)
        self._settle(outcomes.not_run(row, Status.DEAD, error))
        if reason == OVERSIZE_PAYLOAD:
            # As for a payload that does not decode (see _accept).
            task_signals.rejected(self, row, DecodeError(error))

    def _start_buffered(self) -> None:
        """Hand every claimed job to the pool, which starts each as a slot frees up."""
        if self._buffer:
            jobs = list(self._buffer)
            self._buffer.clear()
            self.pool.submit_many(jobs, self._done)

    def _backlog(self) -> int:
        """Claimed jobs not started yet: buffered here or queued in the pool."""
        return len(self._buffer) + self.pool.waiting()

    def _has_backlog(self) -> bool:
        """Whether claimed jobs wait to start (read by the completer's thread)."""
        return self._backlog() > 0

    def _started(self, job: ex.Job) -> bool:
        """A pool is about to run ``job``: False when its lease was found lost while it waited
        (another worker may run it already), or it was revoked while it waited (as Celery
        discards a revoked task it has prefetched); it is dropped instead."""
        # Read without the lock: a lease found lost just after this only means the job runs
        # and its outcome is discarded, as for a job that was running already.
        entry = self._inflight.get(job.id)
        if entry is not None and entry.task.attempt == job.attempt:
            if entry.lost:
                with self._lock:
                    self._inflight.finished(job.id, job.attempt)
                self.log.warning(
                    "task.skipped",
                    task_id=job.id,
                    attempt=job.attempt,
                    reason="its lease was lost before it started: another worker runs it",
                )
                self._wake.set()
                return False
            # Under the lock, as Cancels.flag sets cancel_requested: a revoke either finds the
            # call running (and Cancels.terminate stops it where the pool can) or is seen here.
            with self._lock:
                revoked = entry.cancel_requested
                entry.running = not revoked
            if revoked:
                self.log.info(
                    "task.discarded",
                    task_id=job.id,
                    task_name=job.name,
                    attempt=job.attempt,
                    reason="revoked before it started",
                )
                self._settle(
                    outcomes.not_run(entry.task, Status.CANCELLED, "discarded before it started")
                )
                return False
        if self._debug:
            self._log_started(job)
        self.metrics.started(job.name, job.queue)
        return True

    def _log_started(self, job: ex.Job) -> None:
        self.log.debug(
            "task.started",
            task_id=job.id,
            task_name=job.name,
            queue=job.queue,
            attempt=job.attempt,
            retries=job.retries,
            args=job.headers.get("argsrepr"),
            kwargs=job.headers.get("kwargsrepr"),
        )

    def _burst_done(self, claimed: list[ClaimedTask]) -> bool:
        if not self.burst or claimed or self._has_inflight():
            return False
        return not self.app.broker.any_unfinished(self.queues)

    def _accept(self, row: ClaimedTask) -> ex.Job | None:
        """The job to run for a claimed row, or None when the row was settled at once or this
        very claim is running already."""
        with self._lock:
            if self._inflight.add(row) is None:
                # Found twice: a claim's rows can be read by an adoption (after the listener
                # reconnected) before the claim's own result is back, or the other way round.
                return None
        tlog = TaskLog(self.log, row, self._levels)
        tlog.debug("task.claimed")
        self.metrics.claimed(row.name, row.queue)
        if self._stopping.is_set():
            self._settle(Release(row.id, row.attempt, 0.0, None))
            return None
        if row.expired:
            tlog.info("task.expired", expires_at=str(row.expires_at))
            # task_revoked (expired=True) is sent once the row is written CANCELLED: _written.
            self._settle(outcomes.not_run(row, Status.CANCELLED, "expired"))
            return None
        task = self.app.tasks.get(row.name)
        if task is None:
            self._unknown(row, tlog)
            return None
        try:
            args, kwargs = intake.arguments(row, self.settings.accept_content)
        except Exception as exc:
            tlog.error("task.dead_lettered", reason="undecodable payload", error=str(exc))
            self.metrics.dead_lettered(row.name, row.queue, "undecodable payload")
            self._settle(outcomes.not_run(row, Status.DEAD, f"cannot decode payload: {exc}"))
            task_signals.rejected(self, row, exc)
            return None
        return intake.job_for(
            row,
            task,
            args,
            kwargs,
            hostname=self.id,
            settings=self.settings,
            time_limit=self.time_limit,
            soft_time_limit=self.soft_time_limit,
        )

    def _unknown(self, row: ClaimedTask, tlog: TaskLog) -> None:
        """A row whose task name this worker has not registered.

        During a rolling deploy another live worker may know the name: the row is handed back
        for it. When no live worker consuming the row's queue knows it, the row fails with
        ``NotRegistered`` as in Celery, dead-lettered so it can be requeued once deployed.
        """
        task_signals.unknown(self, row)
        if self.app.broker.task_known(row.name, row.queue, self.settings.lease_seconds):
            tlog.warning(
                "task.unknown",
                retry_in=self.settings.unknown_task_delay,
                hint="not registered on this worker; handed back for a worker that knows it",
            )
            error = f"unregistered task {row.name!r} (worker {self.id})"
            self._settle(Release(row.id, row.attempt, self.settings.unknown_task_delay, error))
            return
        failure = outcomes.unregistered(row)
        tlog.error("task.dead_lettered", reason="unregistered task", error=failure.error)
        self.metrics.dead_lettered(row.name, row.queue, "unregistered task")
        self._settle(failure)

    # -- outcomes ------------------------------------------------------------------------------

    def _done(self, o: ex.Outcome) -> None:
        """Called by the pool when a task finished: queue its final state."""
        self.prefetch.ran(o.runtime)
        with self._lock:
            entry = self._inflight.finishing(o.id, o.attempt)
        if self._backlog() <= self.prefetch_extra // 2:
            # The prefetched jobs are running low: wake the loop to claim more. Until then the
            # pool goes on with its queued jobs without it.
            self._wake.set()
        if entry is None:
            return
        row = entry.task
        final: Final
        if o.kind == ex.SUCCESS:
            # The common case, kept to what it needs: logged only where INFO is on.
            if self._levels[1]:
                TaskLog(self.log, row, self._levels).info(
                    "task.succeeded", duration=round(o.runtime, 6)
                )
            final = outcomes.succeeded(row, o)
        else:
            final, note = outcomes.unsuccessful(
                row,
                o,
                terminated=entry.terminated is not None,
                max_lost_attempts=self.settings.max_lost_attempts,
            )
            note.emit(TaskLog(self.log, row, self._levels))
        if self.metrics.enabled:
            self._count(row, o, final)
        self.completer.put(final)

    def _count(self, row: ClaimedTask, o: ex.Outcome, final: Final) -> None:
        """Record a run's outcome in the metrics (a no-op without --metrics-port)."""
        outcome, dead = outcomes.metric_outcome(o.kind, final)
        if dead is not None:
            self.metrics.dead_lettered(row.name, row.queue, dead)
        self.metrics.finished(row.name, row.queue, outcome, o.runtime, o.error or "")
        self.metrics.active(len(self._inflight))

    def _settle(self, final: Final) -> None:
        """Queue the final write of a claimed row that will not run (or ran)."""
        with self._lock:
            self._inflight.finishing(final.id, final.attempt)
        self.completer.put(final)

    def _written(self, item: Final, status: str | None) -> None:
        """Called by the completer after the fenced write."""
        with self._lock:
            # A hand-back gives the attempt back: the row's next claim has the same one.
            entry = self._inflight.finished(
                item.id, item.attempt, undone=isinstance(item, Release) and status is not None
            )
            self.processed += 1
        if self._backpressure:
            self._wake.set()
        if status is None:
            self.log.warning(
                "lease.lost",
                task_id=item.id,
                attempt=item.attempt,
                action="outcome discarded: another worker owns this task now",
            )
        elif entry is not None and status == Status.CANCELLED and not isinstance(item, Release):
            self.log.info("task.cancelled", task_id=item.id, task_name=entry.task.name)
            self.metrics.finished(entry.task.name, entry.task.queue, "revoked", 0.0)
            task_signals.revoked(
                self.app, entry.task, self.id, expired=entry.task.expired, signum=entry.terminated
            )

    # -- leases --------------------------------------------------------------------------------

    def _owned(self) -> list[tuple[str, int, object]]:
        with self._lock:
            return [(i, e.task.attempt, e) for i, e in self._inflight.items() if not e.lost]

    def _has_inflight(self) -> bool:
        with self._lock:
            return bool(self._inflight) or self.completer.pending > 0

    def _lost(self, task_id: str, attempt: int, token: object) -> None:
        with self._lock:
            entry = self._inflight.get(task_id)
            # The entry must be the very claim the renewal asked about: a row released and
            # claimed again by this worker meanwhile is a new claim.
            if entry is None or entry is not token or entry.finishing:
                # Finalised meanwhile, or about to be: a renewal racing the completer's write
                # misses a row that was just completed, which is no loss.
                return
            entry.lost = True
        self.metrics.leases_lost(1)
        self.log.warning(
            "lease.lost",
            task_id=task_id,
            attempt=attempt,
            action="the task keeps running here but its outcome will be discarded",
        )

    # -- stopping ------------------------------------------------------------------------------

    def _install_signals(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return

        def handler(signum: signal.Signals) -> None:
            if self._stopping.is_set():
                self.log.warning("worker.stopping", mode="cold", signal=signum.name)
                signals.worker_shutting_down.send(
                    sender=self.hostname, sig=signum.name, how="Cold", exitcode=0
                )
                self.stop(cold=True)
            else:
                self.log.info(
                    "worker.stopping",
                    mode="warm",
                    signal=signum.name,
                    grace=self.shutdown_grace,
                    running=self.pool.busy(),
                )
                signals.worker_shutting_down.send(
                    sender=self.hostname, sig=signum.name, how="Warm", exitcode=0
                )
                self.stop()

        # Handled in a thread of their own: the main thread may be holding a lock the handler
        # needs (the log writer's, an event's) when the signal lands.
        SignalRelay(handler, (signal.SIGTERM, signal.SIGINT), name="worker-signals").install()

    def _shutdown(self, threads: list[Any]) -> None:
        if self.parking.ever_parked and self.parking.unpark():
            # No more hand-offs; one made before the unpark is committed once it returns, and
            # handed back here (or by the listener, if it hears of it first).
            self._adopt()
        for job in [*self.pool.take_waiting(), *self._buffer]:
            self._settle(Release(job.id, job.attempt, 0.0, None))
        self._buffer.clear()
        deadline = time.monotonic() + self.shutdown_grace
        while self.pool.busy() and not self._cold.is_set() and time.monotonic() < deadline:
            self._cold.wait(0.05)
        cold = self._cold.is_set() or self.pool.busy() > 0
        self.pool.stop(wait=not cold)
        if cold:
            # Outcomes not yet written stay unwritten: the leases run out and others reclaim.
            self.log.warning("worker.stopped_cold", running=self.pool.busy())
            self.completer.stop(timeout=1.0)
        else:
            self.completer.stop()
        for thread in threads:
            if thread is not self.completer:
                thread.stop()
        for thread in threads:
            thread.join(timeout=2.0)
        self.claims.close()
        with contextlib.suppress(psycopg.Error):
            self.app.broker.unregister_worker(self.id)
        self.metrics.stop()
        self.log.info("worker.stopped", processed=self.processed)
        signals.worker_shutdown.send(sender=self)
        self.app.close()
        if self.freeze_gc:
            gc.unfreeze()
