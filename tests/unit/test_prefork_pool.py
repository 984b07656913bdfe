"""The prefork pool queues ahead: it takes more jobs than it has children, runs each exactly
once in submission order per child, starts the next as soon as a child is free, and hands back
the jobs that have not started."""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import resource
import signal
import threading
import time
from collections.abc import Iterator
from datetime import datetime, timezone
from multiprocessing import Pipe
from typing import Any

import pytest

from pgtasks import Celery
from pgtasks.serialization import encode
from pgtasks.worker.execute import LOST, SUCCESS, Job, Outcome
from pgtasks.worker.pools import (
    _STOP,
    PreforkPool,
    ThreadPool,
    _recv_job,
    _recv_outcome,
    _send_job,
    _send_outcome,
)


def job(name: str, i: int, *args: Any) -> Job:
    return Job(
        id=f"job-{i}",
        name=name,
        attempt=1,
        retries=0,
        max_retries=0,
        args=args,
        kwargs={},
        queue="celery",
        headers={},
        eta=None,
        expires=None,
        hostname="test",
        store_result=True,
        result_serializer="json",
    )


def make_app() -> Celery:
    app = Celery("prefork_pool", broker="postgresql://unused@localhost/unused")

    @app.task(name="pool.pid")
    def pid(pause: float = 0.0) -> int:
        time.sleep(pause)
        return os.getpid()

    @app.task(name="pool.hog")
    def hog(kib: int) -> int:
        block = bytearray(kib * 1024)
        page = resource.getpagesize()
        block[::page] = b"\x01" * len(range(0, len(block), page))  # every page resident
        del block
        return os.getpid()

    return app


def rss_kib() -> int:
    """This process's resident memory now: at most what a child forked from it starts with."""
    with open("/proc/self/statm", encoding="ascii") as statm:
        return int(statm.read().split()[1]) * resource.getpagesize() // 1024


class Collector:
    def __init__(self, expected: int) -> None:
        self.outcomes: list[Outcome] = []
        self.lock = threading.Lock()
        self.all_in = threading.Event()
        self.expected = expected

    def __call__(self, outcome: Outcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)
            if len(self.outcomes) == self.expected:
                self.all_in.set()


@contextlib.contextmanager
def running(concurrency: int, **options: Any) -> Iterator[PreforkPool]:
    """A started prefork pool of ``concurrency`` children, stopped (warm) at the end."""
    pool = PreforkPool(make_app(), concurrency=concurrency, **options)
    pool.start()
    try:
        yield pool
    finally:
        pool.stop(wait=True)


def test_more_jobs_than_children_all_run_once_on_the_children() -> None:
    started: list[str] = []
    with running(concurrency=2) as pool:
        pool.on_start = lambda j: started.append(j.id)
        done = Collector(40)
        for i in range(40):
            pool.submit(job("pool.pid", i), done)
        # Every job was taken at once: two run, the rest wait in the pool.
        assert pool.busy() == 40
        assert done.all_in.wait(30)
        assert sorted(o.id for o in done.outcomes) == sorted(f"job-{i}" for i in range(40))
        assert {o.kind for o in done.outcomes} == {SUCCESS}
        assert sorted(started) == sorted(f"job-{i}" for i in range(40))
        children = {p.pid for p in multiprocessing.active_children()}
        ran_on = {int(o.result.data) for o in done.outcomes if o.result is not None}
        assert ran_on <= children and os.getpid() not in ran_on
        assert pool.busy() == 0 and pool.waiting() == 0


def test_jobs_not_started_are_handed_back() -> None:
    with running(concurrency=1) as pool:
        done = Collector(1)
        pool.submit(job("pool.pid", 0, 0.5), done)
        for i in range(1, 6):
            pool.submit(job("pool.pid", i), done)
        assert pool.waiting() == 5
        back = pool.take_waiting()
        assert [j.id for j in back] == [f"job-{i}" for i in range(1, 6)]
        assert pool.waiting() == 0 and pool.busy() == 1
        # The running job still finishes and is the only outcome.
        assert done.all_in.wait(30)
        time.sleep(0.2)
        assert [o.id for o in done.outcomes] == ["job-0"]


def test_a_killed_child_loses_only_its_own_job() -> None:
    with running(concurrency=1) as pool:
        done = Collector(6)
        started = threading.Event()
        pool.on_start = lambda j: started.set() if j.id == "job-0" else None
        pool.submit(job("pool.pid", 0, 30.0), done)
        for i in range(1, 6):
            pool.submit(job("pool.pid", i), done)
        assert started.wait(10)
        (child,) = multiprocessing.active_children()
        os.kill(child.pid, signal.SIGKILL)
        # The running job is reported lost; every queued one runs on the replacement child.
        assert done.all_in.wait(30), [o.id for o in done.outcomes]
        kinds = {o.id: o.kind for o in done.outcomes}
        assert kinds == {"job-0": LOST, **{f"job-{i}": SUCCESS for i in range(1, 6)}}
        assert pool.busy() == 0 and pool.waiting() == 0


@pytest.mark.parametrize("kind", [PreforkPool, ThreadPool])
def test_a_job_refused_as_it_starts_never_runs(kind: type[ThreadPool | PreforkPool]) -> None:
    # The worker refuses a queued job whose lease was lost while it waited.
    pool = kind(make_app(), concurrency=1)
    pool.start()
    try:
        refused: list[str] = []

        def on_start(j: Job) -> bool:
            if j.id in ("job-1", "job-3"):
                refused.append(j.id)
                return False
            return True

        pool.on_start = on_start
        done = Collector(3)
        pool.submit(job("pool.pid", 0, 0.3), done)
        for i in range(1, 5):
            pool.submit(job("pool.pid", i), done)
        assert done.all_in.wait(30), [o.id for o in done.outcomes]
        time.sleep(0.2)
        assert sorted(o.id for o in done.outcomes) == ["job-0", "job-2", "job-4"]
        assert {o.kind for o in done.outcomes} == {SUCCESS}
        assert refused == ["job-1", "job-3"]
        assert pool.busy() == 0 and pool.waiting() == 0
    finally:
        pool.stop(wait=True)


def test_jobs_and_outcomes_cross_the_pipe_whole() -> None:
    # Every field, as the child and the parent rebuild them from the pipe's bytes.
    sent = Job(
        id="job-x",
        name="pool.pid",
        attempt=3,
        retries=2,
        max_retries=5,
        args=(1, "two", [3.0]),
        kwargs={"k": {"nested": None}},
        queue="q",
        headers={"parent_id": "p", "timelimit": [10, 5]},
        eta=datetime(2026, 1, 2, 3, 4, 5, tzinfo=timezone.utc),
        expires=None,
        hostname="host",
        store_result=False,
        result_serializer="json",
        time_limit=10.0,
        soft_time_limit=5.0,
    )
    outcome = Outcome(
        "job-x",
        3,
        SUCCESS,
        1.5,
        0.25,
        result=encode({"a": 1}, "json"),
        retry_when=datetime(2026, 1, 2, tzinfo=timezone.utc),
        extra={"followups": [{"id": "f"}]},
    )
    parent, child = Pipe(duplex=True)
    try:
        _send_job(parent, sent)
        assert _recv_job(child) == sent
        _send_outcome(child, outcome)
        assert _recv_outcome(parent) == (outcome, 0)
        # A child past its memory limit says so with the outcome (its resident KiB).
        _send_outcome(child, outcome, 123_456)
        assert _recv_outcome(parent) == (outcome, 123_456)
        parent.send_bytes(_STOP)
        assert _recv_job(child) is None
    finally:
        parent.close()
        child.close()


def test_a_child_past_its_memory_limit_is_replaced_and_no_queued_job_is_lost() -> None:
    limit = rss_kib() + 64 * 1024
    with running(concurrency=1, max_memory_per_child=limit) as pool:
        done = Collector(6)
        # Taken at once: the jobs after the hog wait in the pool as it runs.
        pool.submit(job("pool.pid", 0), done)
        pool.submit(job("pool.hog", 1, limit + 64 * 1024), done)
        for i in range(2, 6):
            pool.submit(job("pool.pid", i), done)
        assert done.all_in.wait(60), [o.id for o in done.outcomes]
        assert pool.busy() == 0 and pool.waiting() == 0
    assert {o.kind for o in done.outcomes} == {SUCCESS}
    pids = {o.id: int(o.result.data) for o in done.outcomes if o.result is not None}
    assert pids["job-0"] == pids["job-1"], "the hog ran in the first child and was delivered"
    assert {pids[f"job-{i}"] for i in range(2, 6)} - {pids["job-0"]}, pids
    assert len({pids[f"job-{i}"] for i in range(2, 6)}) == 1, "one fresh child, kept"


def test_a_child_under_its_memory_limit_is_kept() -> None:
    with running(concurrency=1, max_memory_per_child=rss_kib() + 256 * 1024) as pool:
        done = Collector(4)
        pool.submit(job("pool.pid", 0), done)
        pool.submit(job("pool.hog", 1, 16 * 1024), done)
        for i in range(2, 4):
            pool.submit(job("pool.pid", i), done)
        assert done.all_in.wait(30), [o.id for o in done.outcomes]
    assert len({int(o.result.data) for o in done.outcomes if o.result is not None}) == 1
