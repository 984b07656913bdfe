"""The short phases: ``enqueue`` (one by one, with the commit's flush, and in bulk),
``burn-down`` and ``latency``, each timed on its own."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from pgtasks.cli.bench.cost import CostMeter
from pgtasks.cli.bench.figures import latency_split, per_second, percentile
from pgtasks.cli.bench.options import BATCH, COUNT_EVERY, POLL, BenchError
from pgtasks.cli.bench.progress import Progress, bar
from pgtasks.cli.bench.store import BenchStore
from pgtasks.cli.bench.tasks import bench_app, bench_tasks
from pgtasks.cli.bench.workers import Workers
from pgtasks.task import Task

#: Enqueues timed on each side of commit_flush_ms, in alternating blocks.
FLUSH_SAMPLES = 300
FLUSH_BLOCKS = 6


def commit_flush_ms(samples: int = FLUSH_SAMPLES) -> float:
    """Milliseconds of a single enqueue spent waiting for its commit to reach the disk: the
    median enqueue on a session with ``synchronous_commit`` on, less the median with it off,
    in alternating blocks on one connection (never below zero)."""
    timed: dict[str, list[float]] = {"on": [], "off": []}
    broker = bench_app().broker
    store = BenchStore(broker)
    noop = bench_tasks()[0]
    with contextlib.closing(broker.connect()) as conn:
        for block in range(FLUSH_BLOCKS):
            mode = "on" if block % 2 == 0 else "off"
            store.synchronous_commit(mode == "on", conn)
            for i in range(samples // FLUSH_BLOCKS):
                t = time.perf_counter()
                noop.apply_async((i,), connection=conn)
                timed[mode].append(time.perf_counter() - t)
    return max(0.0, (percentile(timed["on"], 50) - percentile(timed["off"], 50)) * 1000)


def enqueue_one_by_one(n: int, progress: Progress) -> dict[str, Any]:
    """``n`` calls of ``delay()`` one after another, then the commit's flush timed."""
    noop = bench_tasks()[0]
    t0 = time.perf_counter()
    for i in range(n):
        noop.delay(i)
        progress.status(f"enqueue (delay) {bar(i + 1, n)}")
    seconds = time.perf_counter() - t0
    rate = per_second(n, seconds)
    progress.status("enqueue: timing the commit's flush")
    flush = commit_flush_ms()
    progress.result(
        f"enqueue one by one: {rate:,.0f} tasks/s ({n:,} x delay); the commit's flush to disk "
        f"takes {flush:.3f} ms of each {1000 / rate:.3f} ms"
    )
    return {"tasks": n, "seconds": seconds, "tasks_per_second": rate, "commit_flush_ms": flush}


def enqueue_bulk(n: int, progress: Progress) -> dict[str, Any]:
    """``n`` calls enqueued with ``apply_many()`` in batches of BATCH."""
    noop = bench_tasks()[0]
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        stop = min(start + BATCH, n)
        noop.apply_many([(i,) for i in range(start, stop)])
        progress.status(f"bulk enqueue {bar(stop, n)}")
    seconds = time.perf_counter() - t0
    rate = per_second(n, seconds)
    progress.result(f"bulk enqueue: {rate:,.0f} tasks/s ({n:,} in batches of {BATCH})")
    return {"tasks": n, "batch": BATCH, "seconds": seconds, "tasks_per_second": rate}


def burn_down(
    n: int, workers: Workers, progress: Progress, task: Task[Any, Any] | None = None
) -> dict[str, Any]:
    """N calls of ``task`` (by default the no-op task) made visible at once, timed until none
    is waiting or running."""
    app = bench_app()
    if task is None:
        task = bench_tasks()[0]
    with contextlib.closing(app.broker.connect(autocommit=False)) as conn:
        for start in range(0, n, BATCH):
            stop = min(start + BATCH, n)
            task.apply_many([(i,) for i in range(start, stop)], connection=conn)
            progress.status(f"burn-down: preparing {bar(stop, n)}")
        # The workers start on the rows as soon as they are committed: the meter and the
        # clock start first, so that a short burn-down is not over before they read.
        meter = CostMeter.start(workers)
        t0 = time.perf_counter()
        conn.commit()
    queues = [app.settings.default_queue]
    left = n
    last_change = time.monotonic()
    next_count = 0.0
    # The end is looked for every POLL seconds with a test that stops at the first unfinished
    # row; the rows left are counted only every COUNT_EVERY seconds, for the progress line and
    # the stall test. Counting tens of thousands of rows every POLL took a fifth of a core on
    # the server, which the burn-down's own figures (its rate, the server's CPU) then carried.
    while app.broker.any_unfinished(queues):
        now = time.monotonic()
        if now >= next_count:
            next_count = now + COUNT_EVERY
            now_left = app.broker.count_unfinished(queues)
            if now_left != left:
                left, last_change = now_left, now
            elif now - last_change > 60:
                raise BenchError(f"burn-down stalled: {left:,} of {n:,} tasks unfinished for 60 s")
            elapsed = time.perf_counter() - t0
            progress.status(f"burn-down {bar(n - left, n)}  {(n - left) / elapsed:,.0f} tasks/s")
        workers.check()
        time.sleep(POLL)
    seconds = time.perf_counter() - t0
    by_status: dict[str, int] = {}
    for row in app.broker.counts():
        by_status[row["status"]] = by_status.get(row["status"], 0) + int(row["n"])
    # Workers that keep no finished rows (finished_task_retention = 0) delete what succeeds.
    gone = n - sum(by_status.values())
    if by_status.get("COMPLETED", 0) + gone != n or set(by_status) - {"COMPLETED"}:
        raise BenchError(f"burn-down: expected {n:,} completed tasks, found {by_status}")
    rate = per_second(n, seconds)
    cost = meter.stop(n)
    progress.result(f"burn-down: {rate:,.0f} tasks/s ({n:,} tasks in {seconds:.2f} s)")
    return {"tasks": n, "seconds": seconds, "tasks_per_second": rate, **cost}


def latency(
    samples: int,
    rate: float,
    workers: Workers,
    progress: Progress,
    task: Task[Any, Any] | None = None,
) -> dict[str, Any]:
    """Paced ``delay()`` calls on idle workers; start minus send, in milliseconds. Each sample
    is also split in two: the ``delay()`` call itself (its statement and its commit, flush to
    disk included) and the time from its return to the task's start, negative where the task
    started before the call returned. ``task`` is the stamping task (by default the one of
    workers on a pool other than asyncio)."""
    if task is None:
        task = bench_tasks()[1]
    task.delay(0.0).get(timeout=30)  # warm-up: every worker connection and statement ready
    interval = 1.0 / rate
    sent: list[Any] = []
    calls: list[float] = []
    t0 = time.perf_counter()
    for i in range(samples):
        pause = t0 + i * interval - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        called = time.perf_counter()
        sent.append(task.delay(time.time()))
        calls.append((time.perf_counter() - called) * 1000)
        progress.status(f"latency {bar(i + 1, samples)} sent at {rate:g}/s")
    workers.check()
    values = [float(result.get(timeout=30)) * 1000 for result in sent]
    report = {
        "samples": samples,
        "rate": rate,
        "p50_ms": percentile(values, 50),
        "p90_ms": percentile(values, 90),
        "p99_ms": percentile(values, 99),
        "max_ms": max(values),
        **latency_split(values, calls),
    }
    progress.result(
        f"delay->start latency: p50 {report['p50_ms']:.2f} ms, p90 {report['p90_ms']:.2f} ms, "
        f"p99 {report['p99_ms']:.2f} ms (n={samples}, {rate:g}/s); the delay() call itself: "
        f"p50 {report['call_p50_ms']:.2f} ms, p99 {report['call_p99_ms']:.2f} ms; "
        f"from its return to the start: p50 {report['after_return_p50_ms']:.2f} ms, "
        f"p99 {report['after_return_p99_ms']:.2f} ms"
    )
    return report
