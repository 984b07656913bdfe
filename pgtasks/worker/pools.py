"""Execution pools. They only run tasks; the worker's main process owns every database call.

- ``prefork`` (default, Celery's): child processes forked from the worker, one task at a time
  each. A child that dies is replaced and its task reported as lost; one running past its task's
  hard time limit is killed and replaced, and the task fails with ``TimeLimitExceeded``. One that
  ran ``max_tasks_per_child`` tasks, or whose resident memory passed ``max_memory_per_child``
  KiB, is replaced once its task's outcome is delivered.
- ``threads``: a thread pool in the worker process (I/O-bound tasks, no per-task IPC).
- ``solo``: one task at a time in the worker process.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import os
import pickle
import queue
import resource
import selectors
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import fields
from multiprocessing import connection as mpc
from multiprocessing import get_context
from operator import attrgetter
from typing import TYPE_CHECKING

import structlog

from pgtasks import signals
from pgtasks import task as task_module
from pgtasks.worker import loop as runtime
from pgtasks.worker import timelimits
from pgtasks.worker.execute import FAILURE, LOST, Job, Outcome, execute, execute_async, unsent

if TYPE_CHECKING:
    from multiprocessing.process import BaseProcess

    from pgtasks.app import Celery

Done = Callable[[Outcome], None]
log = structlog.get_logger("pgtasks")


class Pool:
    """What the worker needs of a pool.

    A pool takes jobs beyond its free slots and starts each as a slot frees up, with no call
    back into the worker in between (threads run job after job from one queue; the prefork
    reader hands a child its next job as it reports an outcome).
    """

    name = "base"

    def __init__(self, app: Celery, concurrency: int) -> None:
        self.app = app
        self.concurrency = max(1, concurrency)
        self._busy = 0
        self._lock = threading.Lock()
        #: Called as a job starts (not when it is handed over): the worker logs the start here.
        #: False: the job is not to run after all (its claim was lost while it waited); it is
        #: dropped without an outcome.
        self.on_start: Callable[[Job], bool | None] | None = None

    def start(self) -> None:
        """Start the pool's threads or processes."""

    def free_slots(self) -> int:
        with self._lock:
            return self.concurrency - self._busy

    def busy(self) -> int:
        with self._lock:
            return self._busy

    def _take(self) -> None:
        with self._lock:
            self._busy += 1

    def _give(self) -> None:
        with self._lock:
            self._busy -= 1

    def submit(self, job: Job, done: Done) -> None:
        raise NotImplementedError

    def submit_many(self, jobs: Sequence[Job], done: Done) -> None:
        """``submit`` each of ``jobs``, in order."""
        for job in jobs:
            self.submit(job, done)

    def run_here(self, job: Job, done: Done) -> Callable[[], None] | None:
        """A slot for ``job`` to run on the calling thread, taken now: the call that runs it
        there. None where this pool runs its jobs only on its own threads or processes, or
        has no idle slot (then ``submit`` it)."""
        return None

    def waiting(self) -> int:
        """Jobs submitted ahead that have not started yet."""
        return 0

    def take_waiting(self) -> list[Job]:
        """Take back the jobs that have not started (to hand their rows back)."""
        return []

    def stop(self, wait: bool) -> None:
        """Stop; ``wait`` lets running tasks finish first."""

    def terminate(self, task_id: str, signum: int) -> bool:
        """Stop the running task ``task_id`` with signal ``signum`` (``revoke(terminate=True)``);
        False where this pool cannot (a thread cannot be stopped from outside)."""
        return False


class ThreadPool(Pool):
    """Tasks run in ``concurrency`` threads of the worker process, fed through one queue.

    Plain threads and a queue rather than ``concurrent.futures``: no Future or callback per
    task, and a cold stop does not wait for a running task (its lease runs out instead). The
    worker queues its prefetched jobs here at once, so a thread goes from one job to the next
    without waiting for the worker's loop.
    """

    name = "threads"
    #: Whether ``run_here`` may run a job on a thread not of the pool's.
    runs_elsewhere = True

    def __init__(self, app: Celery, concurrency: int) -> None:
        super().__init__(app, concurrency)
        self._plain: dict[str, bool] = {}
        #: Jobs running, on the pool's threads and on others (``run_here``): a thread that
        #: takes a job from the queue while ``concurrency`` run waits for one of them to end.
        self._running = 0
        self._waiting_room = 0
        self._room = threading.Condition(threading.Lock())
        # Jobs submitted before start wait here for the threads, as they do for a busy one.
        self._jobs: queue.SimpleQueue[tuple[Job, Done] | None] = queue.SimpleQueue()

    def start(self) -> None:
        self._threads = [
            threading.Thread(target=self._run, name=f"pgtasks-task-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, job: Job, done: Done) -> None:
        with self._lock:
            self._busy += 1
        self._jobs.put((job, done))

    def submit_many(self, jobs: Sequence[Job], done: Done) -> None:
        # One count for the lot: the task threads take the same lock as each job ends.
        with self._lock:
            self._busy += len(jobs)
        for job in jobs:
            self._jobs.put((job, done))

    def waiting(self) -> int:
        return self._jobs.qsize()

    def take_waiting(self) -> list[Job]:
        jobs: list[Job] = []
        with contextlib.suppress(queue.Empty):
            while True:
                item = self._jobs.get_nowait()
                if item is None:
                    # A stop marker: leave it for the threads.
                    self._jobs.put(None)
                    break
                with self._lock:
                    self._busy -= 1
                jobs.append(item[0])
        return jobs

    def run_here(self, job: Job, done: Done) -> Callable[[], None] | None:
        # Plain functions only: an async def call runs on the event loop its thread keeps
        # from call to call (see loop.event_loop_per_thread), so it stays on the pool's.
        if not self.runs_elsewhere or not self._runs_anywhere(job.name):
            return None
        # Only while no job waits in the queue: those were claimed first, and start first.
        with self._room:
            if self._running >= self.concurrency or not self._jobs.empty():
                return None
            self._running += 1
        self._take()
        return lambda: self._execute(job, done)

    def _runs_anywhere(self, name: str) -> bool:
        plain = self._plain.get(name)
        if plain is None:
            task = self.app.tasks.get(name)
            plain = self._plain[name] = (
                task is not None
                and type(task).run is task_module.Task.run
                and not inspect.iscoroutinefunction(task.fun)
            )
        return plain

    def thread_context(self) -> contextlib.AbstractContextManager[None]:
        """What a thread that runs this pool's jobs lives in."""
        return runtime.event_loop_per_thread()

    def _run(self) -> None:
        with self.thread_context():
            self._run_jobs()

    def _run_jobs(self) -> None:
        while True:
            item = self._jobs.get()
            if item is None:
                return
            with self._room:
                while self._running >= self.concurrency:
                    # A job runs on another thread (run_here) and holds the last slot.
                    self._waiting_room += 1
                    self._room.wait()
                    self._waiting_room -= 1
                self._running += 1
            self._execute(*item)

    def _execute(self, job: Job, done: Done) -> None:
        """Run ``job`` on this thread, in a slot taken for it."""
        outcome: Outcome | None = None
        try:
            if self.on_start is None or self.on_start(job) is not False:
                outcome = execute(self.app, job)
        except BaseException as exc:  # execute() does not raise; this is a last guard
            outcome = Outcome(job.id, job.attempt, LOST, time.time(), 0.0, error=repr(exc))
        self._give()
        with self._room:
            self._running -= 1
            if self._waiting_room:
                self._room.notify()
        if outcome is not None:
            done(outcome)

    def stop(self, wait: bool) -> None:
        if not wait:
            # Jobs not started yet stay unstarted: their leases run out and others reclaim them.
            self.take_waiting()
        for _ in self._threads:
            self._jobs.put(None)
        if wait:
            for thread in self._threads:
                thread.join()


class SoloPool(ThreadPool):
    """One task at a time, inside the worker process."""

    name = "solo"
    # Every task on the pool's one thread, as Celery's solo pool runs them on one.
    runs_elsewhere = False

    def __init__(self, app: Celery, concurrency: int) -> None:
        super().__init__(app, 1)

    def start(self) -> None:
        super().start()
        # Tasks run in the worker's own process, which Celery announces the same way.
        signals.worker_process_init.send(sender=None)


class _QueueAhead(Pool):
    """A pool that keeps the jobs beyond its free slots in a queue of its own and starts each
    as a slot frees up."""

    def __init__(self, app: Celery, concurrency: int) -> None:
        super().__init__(app, concurrency)
        self._queued: collections.deque[tuple[Job, Done]] = collections.deque()

    def submit(self, job: Job, done: Done) -> None:
        self.submit_many([job], done)

    def waiting(self) -> int:
        return len(self._queued)

    def take_waiting(self) -> list[Job]:
        with self._lock:
            jobs = [job for job, _ in self._queued]
            self._queued.clear()
            self._busy -= len(jobs)
        return jobs


class AsyncioPool(_QueueAhead):
    """``async def`` task bodies interleave on one event loop in the worker process.

    The loop runs every call of an ``async def`` task itself, from its signals and hooks to
    encoding its result (``execute_async``): no thread hands a call to the loop and waits for
    it, so a call costs about what it costs on the threads pool. ``-c 200`` means 200 calls in
    flight, and clients an async task keeps at module level (an HTTP session, an async pool)
    are shared by all of them. Plain functions (and tasks whose class replaces ``run``) run in
    up to ``concurrency`` threads, as on the threads pool, within the same slots. Signal
    receivers and hooks of async tasks run on the loop, so they must not block for long.
    """

    name = "asyncio"

    def __init__(self, app: Celery, concurrency: int) -> None:
        super().__init__(app, concurrency)
        self._running = 0
        #: The asyncio tasks of the calls on the loop (the loop keeps only weak references).
        self._tasks: set[asyncio.Task[None]] = set()
        self._on_loop: dict[str, bool] = {}
        #: Ids of the calls handed to the loop and not finished (read by terminate()).
        self._loop_calls: set[str] = set()
        self._wake_pending = False
        # Threads for plain functions, started as needed (daemon threads, as on the threads
        # pool: a cold stop does not wait for them).
        self._plain: queue.SimpleQueue[tuple[Job, Done] | None] = queue.SimpleQueue()
        self._threads: list[threading.Thread] = []
        self._idle_threads = 0

    def start(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self._run_loop, name="pgtasks-asyncio", daemon=True
        )
        self._loop_thread.start()
        runtime.use_event_loop(self.loop)
        # Tasks run in the worker's own process, which Celery announces the same way.
        signals.worker_process_init.send(sender=None)

    def _run_loop(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_forever()

    def submit_many(self, jobs: Sequence[Job], done: Done) -> None:
        with self._lock:
            self._busy += len(jobs)
            self._queued.extend((job, done) for job in jobs)
            if self._wake_pending:
                return  # the loop has yet to run the dispatch asked for before
            self._wake_pending = True
        self.loop.call_soon_threadsafe(self._dispatch)

    def _runs_on_loop(self, name: str) -> bool:
        on_loop = self._on_loop.get(name)
        if on_loop is None:
            task = self.app.tasks.get(name)
            on_loop = self._on_loop[name] = task is not None and task.runs_on_loop
        return on_loop

    def _dispatch(self) -> None:
        """Start queued jobs while there are free slots (on the loop)."""
        while True:
            with self._lock:
                self._wake_pending = False
                if not self._queued or self._running >= self.concurrency:
                    return
                job, done = self._queued.popleft()
                self._running += 1
            if self.on_start is not None and self.on_start(job) is False:
                self._finished()
                continue
            if self._runs_on_loop(job.name):
                self._loop_calls.add(job.id)
                self._tasks.add(self.loop.create_task(self._run_on_loop(job, done)))
            else:
                self._to_thread(job, done)

    def _finished(self) -> None:
        with self._lock:
            self._running -= 1
            self._busy -= 1

    async def _run_on_loop(self, job: Job, done: Done) -> None:
        """Run ``job``, then the queued jobs that follow it on the loop, in this one asyncio
        task: a call that comes after another in its slot costs no task, and no round of the
        loop, of its own."""
        current = asyncio.current_task()
        item: tuple[Job, Done] | None = (job, done)
        try:
            while item is not None:
                job, done = item
                try:
                    outcome = await execute_async(self.app, job)
                except asyncio.CancelledError:
                    # Only a cold stop cancels a call other than by terminate(): it reports
                    # nothing and its lease runs out, as for a call still running in a thread.
                    raise
                except BaseException as exc:  # execute_async() does not raise; a last guard
                    outcome = Outcome(job.id, job.attempt, LOST, time.time(), 0.0, error=repr(exc))
                finally:
                    self._loop_calls.discard(job.id)
                if current is not None:
                    runtime.forget_cancels(current)
                self._give()
                done(outcome)
                item = self._next_on_loop()
        finally:
            # Here rather than in a done callback: one round of the loop less.
            self._tasks.discard(current)

    def _next_on_loop(self) -> tuple[Job, Done] | None:
        """The queued job a slot that has just finished a call on the loop goes on with: None
        when the next one is not an ``async def`` call (or none waits), and the slot is given
        back for ``_dispatch`` to fill."""
        while True:
            with self._lock:
                if self._queued and self._runs_on_loop(self._queued[0][0].name):
                    item = self._queued.popleft()
                else:
                    item = None
                    self._running -= 1
            if item is None:
                self._dispatch()
                return None
            if self.on_start is not None and self.on_start(item[0]) is False:
                self._give()
                continue
            self._loop_calls.add(item[0].id)
            return item

    def _to_thread(self, job: Job, done: Done) -> None:
        """Run a plain function's job in an idle thread, or in a new one (never more threads
        than slots: each runs one started job)."""
        with self._lock:
            spawn = self._idle_threads == 0
            if not spawn:
                self._idle_threads -= 1
        self._plain.put((job, done))
        if spawn:
            thread = threading.Thread(
                target=self._run_threaded, name=f"pgtasks-task-{len(self._threads)}", daemon=True
            )
            self._threads.append(thread)
            thread.start()

    def _run_threaded(self) -> None:
        with runtime.event_loop_per_thread():
            self._run_plain_jobs()

    def _run_plain_jobs(self) -> None:
        while True:
            item = self._plain.get()
            if item is None:
                return
            job, done = item
            try:
                outcome = execute(self.app, job)
            except BaseException as exc:  # execute() does not raise; this is a last guard
                outcome = Outcome(job.id, job.attempt, LOST, time.time(), 0.0, error=repr(exc))
            with self._lock:
                self._idle_threads += 1
            self._finished()
            done(outcome)
            with contextlib.suppress(RuntimeError):  # the loop is closed: the pool has stopped
                self.loop.call_soon_threadsafe(self._dispatch)

    def terminate(self, task_id: str, signum: int) -> bool:
        """A coroutine can be stopped safely: it is cancelled where it awaits (whatever the
        signal). A plain function running in one of the threads cannot."""
        if task_id not in self._loop_calls:
            return False
        log.warning("task.terminating", task_id=task_id, signal=signal.Signals(signum).name)
        self.loop.call_soon_threadsafe(self._terminate_on_loop, task_id)
        return True

    def _terminate_on_loop(self, task_id: str) -> None:
        """On the loop: cancel the call, or, where it was handed to the loop but its coroutine
        has yet to begin, have it cancelled as it begins."""
        if task_id in self._loop_calls and not runtime.terminate_coroutine(task_id):
            runtime.terminate_when_running(task_id)

    def stop(self, wait: bool) -> None:
        if wait:
            # Queued jobs run too, as on the threads pool.
            while self.busy():
                time.sleep(0.01)
        else:
            # Jobs not started yet stay unstarted, and running calls are left where they are:
            # their leases run out and others reclaim them.
            self.take_waiting()
        for _ in self._threads:
            self._plain.put(None)
        runtime.use_event_loop(None)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._loop_thread.join(timeout=5)
        if not self.loop.is_running():
            self.loop.close()


class _Child:
    def __init__(self, process: BaseProcess, conn: mpc.Connection) -> None:
        self.process = process
        self.conn = conn
        self.job: Job | None = None
        self.done: Done | None = None
        # The running job's hard time limit: when it passes, the parent kills this child.
        self.deadline: float | None = None
        self.submitted = 0.0
        self.timed_out = False
        self.tasks = 0
        # The signal a revoke stopped this child's job with (revoke(terminate=True)).
        self.revoked: int | None = None


# Jobs and outcomes cross a child's pipe as tuples of their fields, pickled by pickle itself: a
# dataclass instance is pickled through copyreg and rebuilt attribute by attribute, and
# Connection.send's ForkingPickler copies its table of reducers for every message. A job cost
# 10 us to send and 8 to read that way, as a tuple 6.5 and 4.4.
_job_fields = attrgetter(*(f.name for f in fields(Job)))
_outcome_fields = attrgetter(*(f.name for f in fields(Outcome)))
_PROTOCOL = pickle.HIGHEST_PROTOCOL
#: Sent to a child instead of a job: finish and exit.
_STOP = b""


def _job_bytes(job: Job) -> bytes:
    return pickle.dumps(_job_fields(job), _PROTOCOL)


def _send_job(conn: mpc.Connection, job: Job) -> None:
    conn.send_bytes(_job_bytes(job))


def _recv_job(conn: mpc.Connection) -> Job | None:
    """The child's next job; None for a stop."""
    data = conn.recv_bytes()
    return None if data == _STOP else Job(*pickle.loads(data))


def _send_outcome(conn: mpc.Connection, outcome: Outcome, rss: int = 0) -> None:
    """``rss``: the child's peak resident KiB where it passed its limit (else 0), sent along."""
    values = _outcome_fields(outcome)
    conn.send_bytes(pickle.dumps((*values, rss) if rss else values, _PROTOCOL))


def _recv_outcome(conn: mpc.Connection) -> tuple[Outcome, int]:
    """An outcome, and the child's resident KiB where it passed its memory limit (else 0)."""
    values = pickle.loads(conn.recv_bytes())
    if len(values) == _OUTCOME_LENGTH:
        return Outcome(*values), 0
    return Outcome(*values[:-1]), values[-1]


_OUTCOME_LENGTH = len(fields(Outcome))
# getrusage() gives ru_maxrss in bytes on macOS and the BSDs, in KiB elsewhere (billiard's
# mem_rss reads it the same way).
_MAXRSS_IN_BYTES = sys.platform == "darwin" or "bsd" in sys.platform


def peak_rss_kib() -> int:
    """This process's peak resident memory in KiB, as Celery's prefork pool measures it
    (``getrusage``'s ``ru_maxrss``): a child that once grew past its limit is replaced even
    where the allocator kept the memory but no longer uses it, and a fork starts it afresh."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak // 1024 if _MAXRSS_IN_BYTES else peak


def _child_main(app: Celery, conn: mpc.Connection, max_memory: int | None) -> None:
    """A prefork child: run jobs from the pipe until told to stop or the parent goes away."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    # Receivers connected at import in the parent were inherited by fork (Celery's contract).
    signals.worker_process_init.send(sender=None)
    try:
        with runtime.event_loop_per_thread():
            _run_jobs(app, conn, max_memory)
    finally:
        signals.worker_process_shutdown.send(sender=None, pid=os.getpid(), exitcode=0)
        os._exit(0)


def _run_jobs(app: Celery, conn: mpc.Connection, max_memory: int | None) -> None:
    while True:
        try:
            job = _recv_job(conn)
        except (EOFError, OSError):
            return
        if job is None:
            return
        outcome = execute(app, job)
        # Measured here rather than in the parent, which cannot read a child's usage cheaply;
        # the parent retires the child before it could send it another job.
        over = 0
        if max_memory:
            rss = peak_rss_kib()
            over = rss if rss > max_memory else 0
        try:
            _send_outcome(conn, outcome, over)
        except (BrokenPipeError, OSError):
            return


class PreforkPool(_QueueAhead):
    """Child processes, one job at a time each.

    The pool queues ahead: jobs submitted while every child is busy wait here, and the reader
    thread sends the next one to a child the moment that child reports its outcome, before the
    outcome is passed on, with no round through the worker's loop in between.
    """

    name = "prefork"

    def __init__(
        self,
        app: Celery,
        concurrency: int,
        max_tasks_per_child: int | None = None,
        *,
        max_memory_per_child: int | None = None,
        worker_id: str | None = None,
    ) -> None:
        super().__init__(app, concurrency)
        self.max_tasks_per_child = max_tasks_per_child or None
        #: KiB of resident memory past which a child is replaced after its task (Celery's).
        self.max_memory_per_child = max_memory_per_child or None
        self.worker_id = worker_id
        self._ctx = get_context("fork")
        self._children: list[_Child] = []
        self._stopping = False
        self._reader: threading.Thread | None = None

    def _spawn(self) -> _Child:
        parent, child = self._ctx.Pipe(duplex=True)
        process = self._ctx.Process(
            target=_child_main,
            args=(self.app, child, self.max_memory_per_child),
            daemon=True,
            name="pgtasks-child",
        )
        process.start()
        child.close()
        return _Child(process, parent)

    def start(self) -> None:
        self._children = [self._spawn() for _ in range(self.concurrency)]
        self._reader = threading.Thread(target=self._read, name="pgtasks-prefork", daemon=True)
        self._reader.start()

    def submit_many(self, jobs: Sequence[Job], done: Done) -> None:
        with self._lock:
            self._busy += len(jobs)
            self._queued.extend((job, done) for job in jobs)
        self._dispatch()

    def _dispatch(self) -> None:
        """Send queued jobs to idle children (each child runs one job at a time)."""
        while True:
            with self._lock:
                if not self._queued:
                    return
                child = next((c for c in self._children if c.job is None), None)
                if child is None:
                    return
                job, done = self._queued.popleft()
                child.job, child.done = job, done
                child.submitted = time.time()
                child.deadline = time.monotonic() + job.time_limit if job.time_limit else None
            if self.on_start is not None and self.on_start(job) is False:
                with self._lock:
                    self._free(child)
                continue
            try:
                data = _job_bytes(job)
            except Exception as exc:
                # Arguments pickle cannot write (nested too deeply): this call fails alone,
                # and the child takes the next.
                with self._lock:
                    self._free(child)
                done(unsent(job, exc))
                continue
            # On a broken pipe the reader sees the dead child and reports the job lost.
            with contextlib.suppress(BrokenPipeError, OSError):
                child.conn.send_bytes(data)

    def terminate(self, task_id: str, signum: int) -> bool:
        with self._lock:
            child = next((c for c in self._children if c.job and c.job.id == task_id), None)
            pid = child.process.pid if child is not None else None
            if child is None or not pid:
                return False
            child.revoked = signum
        log.warning("task.terminating", task_id=task_id, signal=signal.Signals(signum).name)
        with contextlib.suppress(OSError):
            os.kill(pid, signum)
        return True

    def _free(self, child: _Child) -> None:
        """``child`` takes a new job (call with the lock held)."""
        child.job, child.done, child.deadline = None, None, None
        child.revoked = None
        self._busy -= 1

    def _finish(self, child: _Child, outcome: Outcome) -> None:
        done = child.done
        with self._lock:
            self._free(child)
        # The child's next job first: it runs while this outcome is passed on.
        self._dispatch()
        if done is not None:
            done(outcome)

    def _read(self) -> None:
        # One selector for as long as the children stay the same (multiprocessing's wait()
        # builds and fills one on every call), made again when one is replaced.
        selector: selectors.BaseSelector | None = None
        watched: list[_Child] = []
        try:
            while not (self._stopping and self.busy() == 0):
                with self._lock:
                    children = list(self._children)
                if selector is None or children != watched:
                    if selector is not None:
                        selector.close()
                    selector = selectors.DefaultSelector()
                    for c in children:
                        selector.register(c.conn, selectors.EVENT_READ, ("conn", c))
                        selector.register(c.process.sentinel, selectors.EVENT_READ, ("dead", c))
                    watched = children
                now = time.monotonic()
                deadlines = [c.deadline for c in children if c.deadline is not None]
                timeout = min([0.2, *(max(0.0, d - now) for d in deadlines)])
                for key, _ in selector.select(timeout):
                    kind, child = key.data
                    if kind == "conn":
                        try:
                            outcome, rss = _recv_outcome(child.conn)
                        except (EOFError, OSError):
                            continue  # the sentinel reports the death
                        retired = self._recycle(child, rss)
                        self._finish(child, outcome)
                        if retired:
                            self._retire(child)
                    else:
                        self._replace(child)
                self._enforce_hard_limits(children)
        finally:
            if selector is not None:
                selector.close()

    def _enforce_hard_limits(self, children: list[_Child]) -> None:
        """Kill children running past their job's hard limit; ``_replace`` reports the job."""
        now = time.monotonic()
        for child in children:
            job = child.job
            if job is None or child.deadline is None or now < child.deadline or child.timed_out:
                continue
            child.timed_out = True
            log.error(
                "task.time_limit_exceeded",
                task_id=job.id,
                task_name=job.name,
                limit=job.time_limit,
                action="child process killed and replaced",
            )
            with contextlib.suppress(OSError):
                child.process.kill()

    def _recycle(self, child: _Child, rss: int) -> bool:
        """Count a finished task; past ``max_tasks_per_child``, or with ``rss`` (the child's
        resident KiB, given only past ``max_memory_per_child``), swap in a fresh child (before
        the slot is freed, so the worker never hands the retiring child another job)."""
        if not self.max_tasks_per_child and not rss:
            return False
        with self._lock:
            child.tasks += 1
            if child not in self._children or not (
                rss or (self.max_tasks_per_child and child.tasks >= self.max_tasks_per_child)
            ):
                return False
            self._children.remove(child)
            if not self._stopping:
                self._children.append(self._spawn())
        if rss:
            job = child.job
            log.warning(
                "pool.child_memory_exceeded",
                worker_id=self.worker_id,
                pid=child.process.pid,
                rss_kib=rss,
                limit_kib=self.max_memory_per_child,
                task_id=job.id if job else None,
                task_name=job.name if job else None,
                action="child process replaced after its task",
            )
        return True

    def _retire(self, child: _Child) -> None:
        with contextlib.suppress(BrokenPipeError, OSError):
            child.conn.send_bytes(_STOP)
        child.process.join(timeout=5)
        if child.process.is_alive():
            child.process.kill()
            child.process.join(timeout=1)
        child.conn.close()
        log.debug("pool.child_recycled", tasks=child.tasks)

    def _replace(self, child: _Child) -> None:
        child.process.join(timeout=0.1)
        with self._lock:
            # Out of the list first, so that finishing its job below cannot dispatch the next
            # queued job to this dead child.
            present = child in self._children
            if present:
                self._children.remove(child)
        try:
            # An outcome sent just before the child exited is still in the pipe.
            if child.job is not None and child.conn.poll(0):
                self._finish(child, _recv_outcome(child.conn)[0])
        except (EOFError, OSError):
            pass
        job = child.job
        code = child.process.exitcode
        if job is not None and child.timed_out and job.time_limit:
            # Killed by the parent at the hard limit: the task failed; the worker is fine.
            self._finish(
                child, timelimits.hard_limit_outcome(self.app, job, job.time_limit, child.submitted)
            )
        elif job is not None and child.revoked is not None:
            # Stopped by a revoke: the task ends CANCELLED (its row was flagged before the
            # signal was sent), not as a lost worker to run again.
            name = signal.Signals(child.revoked).name
            self._finish(
                child,
                Outcome(
                    job.id,
                    job.attempt,
                    FAILURE,
                    child.submitted,
                    time.time() - child.submitted,
                    error=f"Terminated: revoked, and its process stopped with {name}",
                ),
            )
        elif job is not None:
            log.error("pool.child_lost", task_id=job.id, task_name=job.name, exitcode=code)
            self._finish(
                child,
                Outcome(
                    job.id,
                    job.attempt,
                    LOST,
                    time.time(),
                    0.0,
                    error=f"WorkerLostError: child process exited with code {code}",
                ),
            )
        with self._lock:
            # (A child retired by _recycle was replaced already.)
            if present and not self._stopping:
                self._children.append(self._spawn())
        child.conn.close()
        self._dispatch()

    def stop(self, wait: bool) -> None:
        self._stopping = True
        if not wait:
            # Jobs not started yet stay unstarted: their leases run out and others reclaim them.
            self.take_waiting()
        if wait:
            deadline = time.monotonic() + 3600
            while self.busy() and time.monotonic() < deadline:
                time.sleep(0.01)
        with self._lock:
            children = list(self._children)
        for c in children:
            try:
                if wait:
                    c.conn.send_bytes(_STOP)
                else:
                    c.process.kill()
            except (BrokenPipeError, OSError):
                pass
        for c in children:
            c.process.join(timeout=5)
            if c.process.is_alive():
                c.process.kill()
                c.process.join(timeout=1)


POOLS: dict[str, type[Pool]] = {
    "prefork": PreforkPool,
    "threads": ThreadPool,
    "solo": SoloPool,
    "asyncio": AsyncioPool,
}


def create(
    name: str,
    app: Celery,
    concurrency: int,
    max_tasks_per_child: int | None = None,
    *,
    max_memory_per_child: int | None = None,
    worker_id: str | None = None,
) -> Pool:
    """The pool called ``name``. ``max_tasks_per_child`` and ``max_memory_per_child`` apply to
    prefork only: the other pools run tasks in the worker's own process, which nothing replaces
    (Celery's threads and solo pools ignore them too); given there, a warning says so."""
    if name == PreforkPool.name:
        return PreforkPool(
            app,
            concurrency,
            max_tasks_per_child,
            max_memory_per_child=max_memory_per_child,
            worker_id=worker_id,
        )
    try:
        kind = POOLS[name]
    except KeyError:
        raise ValueError(f"unknown pool {name!r}; choose one of {', '.join(POOLS)}") from None
    ignored = {
        option: value
        for option, value in (
            ("max_tasks_per_child", max_tasks_per_child),
            ("max_memory_per_child", max_memory_per_child),
        )
        if value
    }
    if ignored:
        log.warning(
            "worker.child_limits_unenforced",
            worker_id=worker_id,
            pool=name,
            **ignored,
            hint="only the prefork pool replaces its child processes; this pool runs tasks "
            "in the worker's own process",
        )
    return kind(app, concurrency)
