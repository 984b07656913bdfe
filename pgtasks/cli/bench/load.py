"""The load phases: ``capacity`` and ``steady`` enqueue while the workers process, and read
their figures window by window (the latency of the tasks finished in each, the size of the
tables, the vacuums and checkpoints that finished), beside a held snapshot when asked for."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import psycopg

from pgtasks.cli.bench.cost import CostMeter
from pgtasks.cli.bench.figures import finished_rate, keeping_up, percentile
from pgtasks.cli.bench.options import (
    BATCH,
    CAPACITY_BACKLOG,
    STEADY_RESULTS_KEPT,
    STEADY_SHARE,
    BenchError,
    Options,
)
from pgtasks.cli.bench.progress import Progress, bar, plural
from pgtasks.cli.bench.store import BenchStore, hold_snapshot
from pgtasks.cli.bench.tasks import bench_app, bench_tasks
from pgtasks.cli.bench.workers import started_workers


class Pace(Protocol):
    """How many tasks the load loop sends now: ``due(elapsed, sent)``."""

    def due(self, elapsed: float, sent: int) -> int: ...


@dataclass
class FixedRate:
    """``rate`` tasks a second, whatever the workers finish (the steady phase)."""

    rate: float

    def due(self, elapsed: float, sent: int) -> int:
        return int(self.rate * elapsed) - sent


@dataclass
class TopUp:
    """As many tasks as the workers take: every ``every`` seconds, the waiting and running
    tasks are counted and topped up to ``backlog`` (the capacity phase). The backlog is large
    enough that a worker never finds the queue empty, and bounded, so that what the workers
    finish is measured on a queue of the size they meet at a steady load."""

    backlog: int
    every: float = 0.05
    _next: float = 0.0

    def due(self, elapsed: float, sent: int) -> int:
        if elapsed < self._next:
            return 0
        self._next = elapsed + self.every
        app = bench_app()
        return max(0, self.backlog - app.broker.count_unfinished([app.settings.default_queue]))


def _load(
    opts: Options, pace: Pace, seconds: float, label: str, progress: Progress
) -> dict[str, Any]:
    """Enqueue as ``pace`` says while the workers process, for ``seconds``; every
    ``opts.window`` seconds, the latency of the tasks finished meanwhile and the table sizes.
    The figures both load phases share."""
    # The windows read the tasks' latency from their results, which are therefore kept at
    # least as long as the finished rows, and for a window's reading at least.
    env = {
        "PGTASKS_FINISHED_TASK_RETENTION": str(opts.steady_retention),
        "PGTASKS_RESULT_EXPIRES": str(max(opts.steady_retention, STEADY_RESULTS_KEPT)),
    }
    broker = bench_app().broker
    store = BenchStore(broker)
    stamping = bench_tasks(opts.pool)[1]
    vacuum_off = broker.autovacuum_off()
    with started_workers(opts, progress, env) as workers, held_snapshot(opts) as held:
        stamping.delay(0.0).get(timeout=30)  # warm-up
        since = store.cost_sample()["now"]
        vacuums_before, checkpoints_before = store.maintenance()
        meter = CostMeter.start(workers)
        windows: list[dict[str, Any]] = []
        sent = finished = sent_before = 0
        window = opts.window
        t0 = time.perf_counter()
        end = t0 + seconds
        next_window = t0 + _window_end(1, window, seconds)
        while True:
            now = time.perf_counter()
            # The last window closes as the phase ends (its loop round sends nothing).
            due = pace.due(now - t0, sent) if now < end else 0
            if due > 0:
                at = time.time()
                for start in range(0, due, BATCH):
                    stamping.apply_many([(at,)] * min(BATCH, due - start))
                sent += due
            if now >= next_window:
                workers.check()
                row = store.steady_window(since)
                if row["done"]:
                    since = row["last_done"]
                finished += row["done"]
                p50, p99 = row["ms"] or (None, None)
                vacuums, checkpoints = store.maintenance()
                windows.append(
                    {
                        "at_s": round(now - t0, 1),
                        "sent_per_second": (sent - sent_before) / window,
                        "finished_per_second": row["done"] / window,
                        "p50_ms": p50,
                        "p99_ms": p99,
                        # Sent and not yet finished, as the windows counted them.
                        "unfinished": max(0, sent - finished),
                        "tasks_mb": row["tasks_bytes"] / 2**20,
                        "results_mb": row["results_bytes"] / 2**20,
                        "attempts_mb": row["attempts_bytes"] / 2**20,
                        # Maintenance that finished in the window: vacuums of these three
                        # tables, and the server's checkpoints.
                        "vacuums": vacuums - vacuums_before,
                        "checkpoints": checkpoints - checkpoints_before,
                    }
                )
                vacuums_before, checkpoints_before = vacuums, checkpoints
                next_window = t0 + _window_end(len(windows) + 1, window, seconds)
                sent_before = sent
                progress.status(
                    f"{label} {bar(int(now - t0), int(seconds))} s  "
                    f"{windows[-1]['finished_per_second']:,.0f}/s finished, "
                    f"p99 {p99 or 0:.1f} ms, tasks table {windows[-1]['tasks_mb']:.0f} MB"
                )
            if now >= end:
                break
            time.sleep(0.01)
        cost = meter.stop(sent)
    if not windows:
        raise BenchError(f"--{label}-seconds must cover at least one {opts.window:g} s window")
    p99s = [w["p99_ms"] for w in windows if w["p99_ms"] is not None]
    half = len(p99s) // 2 or 1
    sizes = [w["tasks_mb"] + w["results_mb"] + w["attempts_mb"] for w in windows]
    return {
        "seconds": seconds,
        "window_seconds": opts.window,
        "sent": sent,
        "retention_seconds": opts.steady_retention,
        "results_kept_seconds": max(opts.steady_retention, STEADY_RESULTS_KEPT),
        "held_snapshot": held,
        "p99_ms_first_half": percentile(p99s[:half], 50) if p99s else None,
        "p99_ms_second_half": percentile(p99s[half:] or p99s, 50) if p99s else None,
        "size_mb_max": max(sizes),
        "size_mb_last": sizes[-1],
        "vacuums": sum(w["vacuums"] for w in windows),
        "checkpoints": sum(w["checkpoints"] for w in windows),
        "windows": windows,
        "autovacuum_off": vacuum_off,
        **cost,
    }


def _window_end(n: int, window: float, seconds: float) -> float:
    """Seconds from a load phase's start to the end of its ``n``-th window; the phase's own
    end for the window that ends with it (three windows of 0.1 s add up to a little more than
    0.3 s in floating point: the last one might not close before the phase ends)."""
    at = n * window
    return seconds if math.isclose(at, seconds) else at


def maintenance_note(report: dict[str, Any]) -> str:
    """The vacuums and checkpoints that finished during a load phase, for its result line
    (the windows say which: a slow window beside one of them is the maintenance's cost)."""
    parts = [
        plural(report[key], word)
        for key, word in (("vacuums", "vacuum"), ("checkpoints", "checkpoint"))
        if report[key]
    ]
    if not parts:
        return ""
    return f"; {' and '.join(parts)} finished during it (by window in the report)"


def _vacuum_verdict(report: dict[str, Any]) -> str:
    if not report["autovacuum_off"]:
        return ""
    return (
        "; autovacuum is off on this server (or for these tables): nothing reclaims the"
        " space of finished rows, so the tables only grow"
    )


def capacity(opts: Options, progress: Progress) -> dict[str, Any]:
    """What the workers finish a second while this process enqueues alongside them: the queue
    is kept topped up to CAPACITY_BACKLOG tasks for ``opts.capacity_seconds``, on the steady
    phase's workers and tasks. The rate is that of the windows after the finished rows and
    results kept have filled (from then on the pruning deletes as much as is enqueued, and its
    cost is in the rate), or of the second half when the phase is too short for that."""
    report = _load(opts, TopUp(CAPACITY_BACKLOG), opts.capacity_seconds, "capacity", progress)
    windows = report["windows"]
    kept = report["results_kept_seconds"]
    settled = [w for w in windows if w["at_s"] - opts.window >= kept]
    measured = settled or windows[len(windows) // 2 :]
    rate = finished_rate(measured)
    report.update(
        backlog=CAPACITY_BACKLOG,
        tasks_per_second=rate,
        measured_from_s=(len(windows) - len(measured)) * opts.window,
        pruning_included=bool(settled),
    )
    caveat = (
        ""
        if settled
        else f"; shorter than the {kept:g} s rows are kept, so without the pruning's cost: "
        f"give --capacity-seconds {_capacity_seconds(kept, opts.window):g} or more"
    )
    progress.result(
        f"capacity: {rate:,.0f} tasks/s finished while enqueueing alongside "
        f"(from {report['measured_from_s']:g} s to {opts.capacity_seconds:g} s, queue kept at "
        f"{CAPACITY_BACKLOG:,} tasks){caveat}{maintenance_note(report)}{_vacuum_verdict(report)}"
    )
    return report


def _capacity_seconds(kept: float, window: float) -> float:
    """The shortest capacity phase that measures four windows after ``kept`` seconds."""
    return kept + 4 * window


def steady(opts: Options, rate: float, progress: Progress) -> dict[str, Any]:
    """Enqueue at ``rate`` per second while the workers process, for ``opts.steady_seconds``;
    every ``opts.window`` seconds, the latency of the tasks finished meanwhile and the table
    sizes."""
    report = _load(opts, FixedRate(rate), opts.steady_seconds, "steady", progress)
    report = {"offered_per_second": rate, **report, **keeping_up(report["windows"], rate)}
    if report["kept_up"]:
        verdict = "the workers kept up"
    else:
        verdict = (
            f"the workers fell behind: {report['finished_per_second_second_half']:,.0f} "
            f"finished a second in the second half, {report['unfinished_at_end']:,} waiting at "
            "the end; the figures are those of a growing backlog, so try a lower --steady-rate,"
            f" such as {report['suggested_rate']} ({STEADY_SHARE:.0%} of what they finished)"
        )
    progress.result(
        f"steady: {rate:,.0f} tasks/s offered for {opts.steady_seconds:g} s"
        f"{' under a held snapshot' if report['held_snapshot'] else ''}; median window "
        f"p99 {report['p99_ms_first_half'] or 0:.1f} ms in the first half, "
        f"{report['p99_ms_second_half'] or 0:.1f} ms in the second; tables at most "
        f"{report['size_mb_max']:.0f} MB; {verdict}{maintenance_note(report)}"
        f"{_vacuum_verdict(report)}"
    )
    return report


@contextlib.contextmanager
def held_snapshot(opts: Options) -> Iterator[bool]:
    """With ``hold_snapshot``, a transaction open for the block whose snapshot was taken at its
    start (the xmin horizon does not move on while it is open); yields whether one is held."""
    if not opts.hold_snapshot:
        yield False
        return
    with psycopg.connect(opts.database_url) as conn:
        hold_snapshot(conn)  # an xid and a snapshot, kept until rollback
        try:
            yield True
        finally:
            conn.rollback()
