"""The threads pool lets a plain function's job run on a thread of the caller's (a hand-off,
on the thread that heard of it) in one of its slots: never more jobs at once than its
concurrency, queued jobs first, and a slot given back however the job ends."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from pgtasks import Celery
from pgtasks.worker.execute import SUCCESS, Job, Outcome
from pgtasks.worker.pools import SoloPool, ThreadPool
from tests.unit.test_prefork_pool import Collector, job


class Gauge:
    """Counts the calls running at once, and holds each until released."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.now = self.most = 0
        self.started = threading.Semaphore(0)
        self.release = threading.Event()
        self.threads: list[str] = []

    def __call__(self) -> str:
        with self.lock:
            self.now += 1
            self.most = max(self.most, self.now)
            self.threads.append(threading.current_thread().name)
        self.started.release()
        try:
            self.release.wait(10)
        finally:
            with self.lock:
                self.now -= 1
        return threading.current_thread().name


def make_app(gauge: Gauge) -> Celery:
    app = Celery("thread_pool", broker="postgresql://unused@localhost/unused")

    @app.task(name="pool.gauge")
    def measured() -> str:
        return gauge()

    return app


@contextmanager
def running(gauge: Gauge, concurrency: int) -> Iterator[ThreadPool]:
    """A started threads pool, stopped (warm) at the end with every held call let go."""
    pool = ThreadPool(make_app(gauge), concurrency=concurrency)
    pool.start()
    try:
        yield pool
    finally:
        gauge.release.set()
        pool.stop(wait=True)


def run_on_new_thread(run: Any) -> threading.Thread:
    thread = threading.Thread(target=run, name="caller", daemon=True)
    thread.start()
    return thread


def test_a_job_run_here_holds_a_slot_of_the_pool() -> None:
    gauge = Gauge()
    with running(gauge, concurrency=1) as pool:
        done = Collector(2)
        run = pool.run_here(job("pool.gauge", 0), done)
        assert run is not None
        assert pool.free_slots() == 0
        caller = run_on_new_thread(run)
        assert gauge.started.acquire(timeout=10)
        # The pool's thread takes the next job from the queue, and waits for the slot.
        pool.submit(job("pool.gauge", 1), done)
        assert not gauge.started.acquire(timeout=0.3)
        # No slot is idle: the next hand-off goes to the queue.
        assert pool.run_here(job("pool.gauge", 2), done) is None
        gauge.release.set()
        assert done.all_in.wait(10)
        caller.join(10)
        assert gauge.most == 1
        assert gauge.threads == ["caller", "pgtasks-task-0"]
        assert [(o.id, o.kind) for o in done.outcomes] == [("job-0", SUCCESS), ("job-1", SUCCESS)]
        assert pool.busy() == 0 and pool.free_slots() == 1


def test_queued_jobs_start_before_a_job_run_here() -> None:
    gauge = Gauge()
    gauge.release.set()
    pool = ThreadPool(make_app(gauge), concurrency=2)
    # The pool's threads not started yet: a job submitted waits in the queue, as one does
    # between its submission and a thread taking it.
    done = Collector(1)
    pool.submit(job("pool.gauge", 0), done)
    assert pool.free_slots() == 1
    assert pool.run_here(job("pool.gauge", 1), done) is None


def test_the_solo_pool_and_async_calls_keep_to_the_pools_threads() -> None:
    gauge = Gauge()
    app = make_app(gauge)

    @app.task(name="pool.coroutine")
    async def coroutine() -> None:
        pass

    solo = SoloPool(app, concurrency=1)
    solo.start()
    threads = ThreadPool(app, concurrency=1)
    threads.start()
    try:
        done = Collector(1)
        # Celery's solo pool runs every task on one thread.
        assert solo.run_here(job("pool.gauge", 0), done) is None
        # An async def call runs on the event loop its pool thread keeps from call to call.
        assert threads.run_here(job("pool.coroutine", 1), done) is None
        # A task this worker does not know fails on the pool's thread, as any.
        assert threads.run_here(job("pool.unknown", 2), done) is None
        assert threads.free_slots() == 1 and solo.free_slots() == 1
    finally:
        solo.stop(wait=True)
        threads.stop(wait=True)


def test_with_room_for_more_a_job_run_here_runs_beside_the_pools() -> None:
    gauge = Gauge()
    with running(gauge, concurrency=2) as pool:
        done = Collector(3)
        pool.submit(job("pool.gauge", 0), done)
        assert gauge.started.acquire(timeout=10)
        run = pool.run_here(job("pool.gauge", 1), done)
        assert run is not None
        caller = run_on_new_thread(run)
        assert gauge.started.acquire(timeout=10)
        # Both slots held: a third job waits in the queue, on a thread that has taken it.
        pool.submit(job("pool.gauge", 2), done)
        assert not gauge.started.acquire(timeout=0.3)
        assert gauge.most == 2
        gauge.release.set()
        assert done.all_in.wait(10)
        caller.join(10)
        assert gauge.most == 2
        assert sorted(o.id for o in done.outcomes) == ["job-0", "job-1", "job-2"]


def test_a_job_run_here_refused_as_it_starts_gives_its_slot_back() -> None:
    gauge = Gauge()
    gauge.release.set()
    with running(gauge, concurrency=1) as pool:
        pool.on_start = lambda j: j.id != "job-0"
        outcomes: list[Outcome] = []
        run = pool.run_here(job("pool.gauge", 0), outcomes.append)
        assert run is not None
        run()
        assert outcomes == [] and gauge.threads == []
        assert pool.busy() == 0
        again = pool.run_here(job("pool.gauge", 1), outcomes.append)
        assert again is not None
        again()
        assert [o.id for o in outcomes] == ["job-1"]


def test_a_job_that_raises_past_the_guard_still_gives_its_slot_back() -> None:
    gauge = Gauge()
    gauge.release.set()
    with running(gauge, concurrency=1) as pool:

        def refuse(j: Job) -> bool:
            raise RuntimeError("on_start failed")

        pool.on_start = refuse
        outcomes: list[Outcome] = []
        run = pool.run_here(job("pool.gauge", 0), outcomes.append)
        assert run is not None
        run()
        assert [o.kind for o in outcomes] == ["lost"]
        assert pool.busy() == 0 and pool.free_slots() == 1
