"""A quick local measurement: burn-down of N no-op tasks by worker processes, and the time
from ``.delay()`` to task start on idle workers.

    python -m benchmarks.quick --dsn postgresql://localhost/bench [--tasks 10000] [--workers 2]

It uses its own schema (dropped first), starts the workers as ``pgtasks worker`` processes and
prints a summary. The side-by-side comparison with other queues is the shared harness
(``benchmarks/pgtasks_adapter.py``).
"""

from __future__ import annotations

import argparse
import os
import signal
import statistics
import subprocess
import sys
import time

import psycopg
from psycopg import sql

from pgtasks import Celery
from pgtasks.migrate import migrate

SCHEMA = os.environ.get("PGTASKS_SCHEMA_NAME", "pgtasks_bench")
app = Celery("bench", broker=os.environ.get("PGTASKS_DATABASE_URL"), schema_name=SCHEMA)


@app.task(name="bench.noop", ignore_result=True)
def noop(i: int) -> None:
    """Does nothing: measures the queue, not the task."""


@app.task(name="bench.stamp")
def stamp(sent: float) -> float:
    """Returns when it started, so the caller can compute enqueue-to-start latency."""
    return time.time()


def pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def count(conn: psycopg.Connection[tuple[int]], status: str) -> int:
    row = conn.execute(
        sql.SQL("SELECT count(*) FROM {}.tasks WHERE status = %s").format(sql.Identifier(SCHEMA)),
        (status,),
    ).fetchone()
    return int(row[0]) if row else 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dsn", default=os.environ.get("PGTASKS_DATABASE_URL"))
    parser.add_argument("--tasks", type=int, default=10_000)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--concurrency", type=int, default=1, help="slots per worker")
    parser.add_argument("--pool", default="threads")
    parser.add_argument("--prefetch-multiplier", type=int, default=1)
    parser.add_argument("--latency-samples", type=int, default=300)
    parser.add_argument("--rate", type=float, default=50.0)
    args = parser.parse_args()
    if not args.dsn:
        sys.exit("give --dsn or set PGTASKS_DATABASE_URL")
    app.conf["broker_url"] = args.dsn
    with psycopg.connect(args.dsn, autocommit=True) as conn:
        conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(SCHEMA)))
    migrate(args.dsn, SCHEMA)

    t0 = time.perf_counter()
    for start in range(0, args.tasks, 1000):
        noop.apply_many([(i,) for i in range(start, min(start + 1000, args.tasks))])
    enqueue_s = time.perf_counter() - t0
    print(f"bulk enqueue: {args.tasks / enqueue_s:,.0f} tasks/s")

    env = dict(os.environ, PGTASKS_DATABASE_URL=args.dsn, PGTASKS_SCHEMA_NAME=SCHEMA)
    cmd = [
        sys.executable,
        "-m",
        "pgtasks",
        "-A",
        "benchmarks.quick",
        "worker",
        "-l",
        "WARNING",
        "-c",
        str(args.concurrency),
        "-P",
        args.pool,
        "--prefetch-multiplier",
        str(args.prefetch_multiplier),
    ]
    procs = [subprocess.Popen(cmd, env=env) for _ in range(args.workers)]
    try:
        with psycopg.connect(args.dsn, autocommit=True) as conn:
            first = last = None
            while True:
                done = count(conn, "COMPLETED")
                now = time.perf_counter()
                if done and first is None:
                    first, first_done = now, done
                if done >= args.tasks:
                    last = now
                    break
                time.sleep(0.01)
        assert first is not None and last is not None
        rate = (args.tasks - first_done) / (last - first) if last > first else float("nan")
        print(
            f"burn-down: {rate:,.0f} tasks/s ({args.workers} workers x {args.concurrency} "
            f"{args.pool} slots, {args.tasks} tasks)"
        )

        # Latency on idle workers: warm up, then paced single enqueues.
        stamp.delay(0.0).get(timeout=30)
        sent_results = []
        interval = 1.0 / args.rate
        t1 = time.perf_counter()
        for i in range(args.latency_samples):
            delay = t1 + i * interval - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            sent = time.time()
            sent_results.append((sent, stamp.delay(sent)))
        lat = [(r.get(timeout=30) - sent) * 1000 for sent, r in sent_results]
        print(
            f"delay->start latency: p50 {pct(lat, 50):.2f} ms, p95 {pct(lat, 95):.2f} ms, "
            f"p99 {pct(lat, 99):.2f} ms, max {max(lat):.2f} ms (n={len(lat)}, "
            f"mean {statistics.mean(lat):.2f})"
        )
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(20)
            except subprocess.TimeoutExpired:
                p.kill()
        app.close()


if __name__ == "__main__":
    main()
