"""``pgtasks bench``: what pgtasks does on your database, measured with no-op tasks.

Five phases, run in the schema ``pgtasks_bench`` (created fresh, marked as the bench's by its
comment, dropped at the end) so the application's own tasks are never touched:

- ``enqueue``: ``task.delay()`` one call at a time, then ``task.apply_many()`` in batches of
  1000, in tasks per second, and how much of a single enqueue is its commit's wait for the disk
  (the same enqueue with ``synchronous_commit`` on and off);
- ``burn-down``: worker processes (``python -m pgtasks -A pgtasks.bench worker``) started and
  registered first, then N tasks made visible at once (one transaction), timed until every one
  has finished;
- ``latency``: on idle workers, paced ``delay()`` calls whose task returns the time it started;
  the percentiles of start minus send, in milliseconds, and of its two parts: the ``delay()``
  call itself (its commit included) and the time from its return to the task's start
  (negative when the task started first: a task handed to a waiting worker starts as its row
  commits, while the call waits for the flush to disk);
- ``capacity`` (only when asked for): what the workers finish while the bench enqueues
  alongside them, keeping the queue topped up, once the pruning keeps pace;
- ``steady`` (only when asked for): enqueue and processing together at a fixed offered load
  (by default 80% of the capacity, else of the burn-down rate) for several minutes, with
  latency percentiles and the size of the tables every ten seconds, on workers keeping
  finished rows for a minute.

The capacity and steady phases read their figures window by window, ten seconds each unless
``window`` says otherwise; shorter windows make a run of a few seconds possible, to check that
the bench runs on a database, but hold too few tasks for figures that mean anything.

Burn-down and steady also report what a task costs: WAL bytes per task, the CPU time of the
worker processes per 1,000 tasks, and that of the server processes serving the database (both
read from ``/proc``, so only on Linux, and the server's only when it runs on this host).

This module is also the workers' app: they import it with ``-A pgtasks.bench`` and read the
database URL and schema from ``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``. Workers of
the asyncio pool run ``async def`` versions of the same tasks (see ``bench_tasks``).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import psycopg

from pgtasks import __version__
from pgtasks.app import Celery
from pgtasks.exceptions import PgTasksError
from pgtasks.migrate import migrate
from pgtasks.task import Task

DEFAULT_SCHEMA = "pgtasks_bench"
#: What ``--only`` accepts; ``enqueue`` covers the one-by-one and the bulk enqueue.
PHASES = ("enqueue", "burn-down", "latency", "capacity", "steady")
#: What runs without ``--only`` (the capacity and steady phases take minutes: they run when
#: asked for).
DEFAULT_PHASES = ("enqueue", "burn-down", "latency")
#: The load phases (capacity, steady) sample latency and sizes this often by default
#: (seconds): long enough for a window to hold many tasks and to outlast a vacuum's pause.
WINDOW = 10.0
#: The steady phase's workers keep results at least this long (seconds): its windows read them.
STEADY_RESULTS_KEPT = 60.0
#: The share of a measured rate the steady phase offers: of the burn-down's when no
#: --steady-rate is given, and of what the workers finished in the rate it suggests next.
STEADY_SHARE = 0.8
#: The steady phase's workers kept up if at most this many seconds of the offered load were
#: sent and not yet finished when it ended.
KEPT_UP_SECONDS = 2.0
BATCH = 1000
#: How often the burn-down looks for its end (seconds), and how often it counts what is left.
POLL = 0.05
COUNT_EVERY = 0.5
#: Waiting and running tasks the capacity phase keeps in the queue: seconds of work for one
#: worker slot, a fraction of a second for the queue's whole rate.
CAPACITY_BACKLOG = 5000

app = Celery(
    "pgtasks.bench",
    broker=os.environ.get("PGTASKS_DATABASE_URL"),
    schema_name=DEFAULT_SCHEMA,
    set_as_current=False,
)


@app.task(name="pgtasks.bench.noop", ignore_result=True)
def noop(i: int) -> None:
    """Does nothing: measures the queue, not the task."""


@app.task(name="pgtasks.bench.stamp")
def stamp(sent: float) -> float:
    """Returns its send-to-start latency in seconds (``sent`` is the sender's ``time.time()``:
    sender and workers share the bench's host), so reading latencies reads results only."""
    return time.time() - sent


@app.task(name="pgtasks.bench.anoop", ignore_result=True)
async def anoop(i: int) -> None:
    """``noop`` as a coroutine, for workers of the asyncio pool."""


@app.task(name="pgtasks.bench.astamp")
async def astamp(sent: float) -> float:
    """``stamp`` as a coroutine, for workers of the asyncio pool."""
    return time.time() - sent


def bench_tasks(pool: str) -> tuple[Task[Any, Any], Task[Any, Any]]:
    """The no-op task and the stamping task the workers of ``pool`` run: coroutines on the
    asyncio pool (what it is for), plain functions on the others."""
    if pool == "asyncio":
        return anoop, astamp
    return noop, stamp


class BenchError(PgTasksError):
    """The benchmark cannot run or did not finish."""


@dataclass
class Options:
    database_url: str
    schema: str = DEFAULT_SCHEMA
    tasks: int = 20_000
    workers: int = 2
    concurrency: int = 1
    pool: str = "threads"
    prefetch_multiplier: int | None = None
    latency_samples: int = 300
    rate: float = 50.0
    phases: Sequence[str] = DEFAULT_PHASES
    capacity_seconds: float = 150.0
    steady_seconds: float = 300.0
    #: Length of the load phases' windows (seconds); the capacity phase runs two at least,
    #: the steady phase one.
    window: float = WINDOW
    #: Offered load of the steady phase; None: 80% of this run's capacity (or, without the
    #: capacity phase, of its burn-down rate).
    steady_rate: float | None = None
    #: finished_task_retention of the steady phase's workers (seconds; 0: none kept).
    steady_retention: float = 60.0
    #: Hold a REPEATABLE READ transaction open through the steady phase: its snapshot keeps
    #: vacuum from removing any row that dies meanwhile (the xmin horizon stands still).
    hold_snapshot: bool = False
    keep: bool = False
    force: bool = False

    @property
    def one_by_one(self) -> int:
        """How many tasks the one-by-one enqueue sends: a tenth of ``tasks``, at least 1000."""
        return max(1000, self.tasks // 10)


def check_options(opts: Options) -> None:
    """Raise BenchError for options no run can honour: an unknown phase, a count below one,
    or a load phase shorter than the windows it is measured in (the capacity phase measures
    its second half, so it needs two; the steady phase one)."""
    unknown = set(opts.phases) - set(PHASES)
    if unknown:
        raise BenchError(f"unknown phase {sorted(unknown)[0]!r}: choose from {', '.join(PHASES)}")
    if opts.tasks < 1 or opts.workers < 1 or opts.concurrency < 1:
        raise BenchError("--tasks, --workers and --concurrency must be at least 1")
    if opts.window <= 0:
        raise BenchError("--window-seconds must be above zero")
    if "capacity" in opts.phases and opts.capacity_seconds < 2 * opts.window:
        raise BenchError(
            f"--capacity-seconds must cover two windows of {opts.window:g} s "
            f"(--window-seconds): give {2 * opts.window:g} or more"
        )
    if "steady" in opts.phases and opts.steady_seconds < opts.window:
        raise BenchError(
            f"--steady-seconds must cover a window of {opts.window:g} s (--window-seconds): "
            f"give {opts.window:g} or more"
        )


# -- progress ---------------------------------------------------------------------------------


class Progress:
    """A status line redrawn a few times a second on a terminal, and one result line per phase.

    ``stream`` gets the results; the status line only when it is a TTY.
    """

    INTERVAL = 0.25

    def __init__(self, stream: IO[str] | None = None, quiet: bool = False) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.quiet = quiet
        self.live = not quiet and self.stream.isatty()
        self._next = 0.0
        self._shown = False

    def status(self, text: str, force: bool = False) -> None:
        if not self.live:
            return
        now = time.monotonic()
        if not force and now < self._next:
            return
        self._next = now + self.INTERVAL
        self.stream.write(f"\r\x1b[2K{text}")
        self.stream.flush()
        self._shown = True

    def clear(self) -> None:
        if self._shown:
            self.stream.write("\r\x1b[2K")
            self.stream.flush()
            self._shown = False

    def result(self, text: str) -> None:
        self.clear()
        if not self.quiet:
            self.stream.write(text + "\n")
            self.stream.flush()


def _bar(done: int, total: int, width: int = 24) -> str:
    filled = width * done // total if total else width
    return f"[{'#' * filled}{'.' * (width - filled)}] {done:,}/{total:,}"


def _plural(n: int, word: str) -> str:
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile, interpolated between the closest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


# -- workers ----------------------------------------------------------------------------------


@dataclass
class Workers:
    """The benchmark's worker processes, each with its log in a temporary file."""

    procs: list[subprocess.Popen[bytes]] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    logs: list[IO[bytes]] = field(default_factory=list)
    files: contextlib.ExitStack = field(default_factory=contextlib.ExitStack)

    def check(self) -> None:
        """Raise when a worker has exited."""
        for proc, log in zip(self.procs, self.logs, strict=True):
            code = proc.poll()
            if code is not None:
                log.seek(0)
                tail = log.read().decode("utf-8", "replace").strip().splitlines()[-15:]
                detail = "\n".join(tail) or "(no output)"
                raise BenchError(f"a worker exited with code {code}:\n{detail}")

    def stop(self, grace: float = 10.0) -> None:
        """SIGTERM to every worker, then SIGKILL to those still running after ``grace`` s."""
        for proc in self.procs:
            if proc.poll() is None:
                with contextlib.suppress(OSError):
                    proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + grace
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.files.close()


@contextlib.contextmanager
def started_workers(
    opts: Options, progress: Progress, settings: dict[str, str] | None = None
) -> Iterator[Workers]:
    """``opts.workers`` worker processes, registered and idle, for the block; always stopped.
    ``settings`` are extra ``PGTASKS_*`` variables for them."""
    env = {k: v for k, v in os.environ.items() if k != "PGTASKS_APP"}
    env.update(PGTASKS_DATABASE_URL=opts.database_url, PGTASKS_SCHEMA_NAME=opts.schema)
    env.update(settings or {})
    workers = Workers()
    try:
        for i in range(opts.workers):
            worker_id = f"bench-{i + 1}-{uuid.uuid4().hex[:6]}"
            cmd = [sys.executable, "-m", "pgtasks", "-A", "pgtasks.bench", "worker"]
            cmd += ["-n", worker_id, "-l", "WARNING", "--log-format", "console"]
            cmd += ["-c", str(opts.concurrency), "-P", opts.pool]
            if opts.prefetch_multiplier:
                cmd += ["--prefetch-multiplier", str(opts.prefetch_multiplier)]
            # Closed with the others by Workers.stop.
            log = workers.files.enter_context(tempfile.TemporaryFile())  # noqa: SIM115
            workers.logs.append(log)
            # Their own session: a Ctrl-C reaches the bench only, which then stops them.
            workers.procs.append(
                subprocess.Popen(
                    cmd,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            workers.ids.append(worker_id)
        deadline = time.monotonic() + 60
        while True:
            workers.check()
            live = {row["id"] for row in app.broker.live_workers(30)}
            ready = len(live & set(workers.ids))
            if ready == len(workers.ids):
                break
            if time.monotonic() > deadline:
                raise BenchError(f"only {ready} of {opts.workers} workers registered within 60 s")
            progress.status(f"starting workers: {ready}/{opts.workers} ready")
            time.sleep(0.05)
        progress.clear()
        yield workers
    finally:
        progress.clear()
        workers.stop()


# -- cost per task ----------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of ``/proc/<pid>/stat`` after the command name (None where there is none)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


#: Each process's threads as last read (nanoseconds by thread id): a thread that ended since
#: still counts at its last reading, so that a process's total never goes back.
_THREADS_SEEN: dict[int, dict[str, int]] = {}


def _run_time(pid: int) -> float | None:
    """CPU seconds so far of ``pid``'s threads to the nanosecond, from each one's
    ``/proc/<pid>/task/<tid>/schedstat`` (None where the kernel keeps none, or the process
    ended as it was read). A thread that ended counts with what it had used when last read
    (the kernel drops its statistics): what it used after that is not counted."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
        now: dict[str, int] = {}
        for tid in tids:
            with (
                contextlib.suppress(FileNotFoundError, ProcessLookupError),
                open(f"/proc/{pid}/task/{tid}/schedstat") as f,
            ):
                now[tid] = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    if not now:
        return None
    seen = _THREADS_SEEN.setdefault(pid, {})
    seen.update(now)
    return sum(seen.values()) / 1e9


def _cpu_seconds(pids: Sequence[int], command: str | None = None) -> dict[int, float]:
    """CPU seconds so far of each of ``pids`` that runs here (and runs ``command``, if given):
    to the nanosecond where the kernel keeps scheduler statistics, else in clock ticks (a
    hundredth of a second, too coarse for a short phase)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    seconds: dict[int, float] = {}
    for pid in pids:
        if command is not None:
            try:
                with open(f"/proc/{pid}/comm") as f:
                    if f.read().strip() != command:
                        continue
            except OSError:
                continue
        exact = _run_time(pid)
        if exact is not None:
            seconds[pid] = exact
            continue
        fields = _stat(pid)
        if fields is not None and len(fields) > 12:
            seconds[pid] = (int(fields[11]) + int(fields[12])) / tick
    return seconds


def _server_cpu(pids: Sequence[int]) -> dict[int, float]:
    """CPU seconds so far of the local PostgreSQL processes among ``pids`` (none when the
    server runs elsewhere)."""
    return _cpu_seconds(pids, "postgres")


def _with_children(pids: Sequence[int]) -> list[int]:
    """``pids`` and their child processes (a prefork worker's pool)."""
    parents = set(pids)
    found = list(pids)
    with contextlib.suppress(OSError):
        for entry in os.listdir("/proc"):
            if entry.isdigit() and int(entry) not in parents:
                fields = _stat(int(entry))
                if fields is not None and len(fields) > 1 and int(fields[1]) in parents:
                    found.append(int(entry))
    return found


def _worker_cpu(workers: Workers) -> dict[int, float]:
    """CPU seconds so far of the worker processes and their children."""
    return _cpu_seconds(_with_children([proc.pid for proc in workers.procs]))


def _per_1000(start: dict[int, float], end: dict[int, float], tasks: int) -> float | None:
    """CPU milliseconds per 1,000 tasks between two readings; processes that started meanwhile
    count from zero, those that ended are missed."""
    if not end or not tasks:
        return None
    return sum(v - start.get(pid, 0.0) for pid, v in end.items()) * 1e6 / tasks


@dataclass
class CostMeter:
    """WAL written and the server's and workers' CPU used over a stretch of work, and that of
    this process (which enqueues in the capacity and steady phases)."""

    lsn: str
    cpu: dict[int, float]
    workers: Workers
    worker_cpu: dict[int, float]
    own_cpu: float

    @classmethod
    def start(cls, workers: Workers) -> CostMeter:
        sample = app.broker.bench_cost_sample()
        return cls(
            str(sample["lsn"]),
            _server_cpu(sample["pids"]),
            workers,
            _worker_cpu(workers),
            time.process_time(),
        )

    def stop(self, tasks: int) -> dict[str, float | None]:
        wal = app.broker.bench_wal_bytes(self.lsn)
        end = _server_cpu(app.broker.bench_cost_sample()["pids"])
        own = time.process_time() - self.own_cpu
        return {
            "wal_bytes_per_task": wal / tasks if tasks else None,
            "db_cpu_ms_per_1000_tasks": _per_1000(self.cpu, end, tasks),
            "worker_cpu_ms_per_1000_tasks": _per_1000(
                self.worker_cpu, _worker_cpu(self.workers), tasks
            ),
            "bench_cpu_ms_per_1000_tasks": own * 1e6 / tasks if tasks else None,
        }


# -- phases -----------------------------------------------------------------------------------


def _rate(n: int, seconds: float) -> float:
    return n / seconds if seconds > 0 else float("inf")


#: Enqueues timed on each side of commit_flush_ms, in alternating blocks.
FLUSH_SAMPLES = 300
FLUSH_BLOCKS = 6


def commit_flush_ms(samples: int = FLUSH_SAMPLES) -> float:
    """Milliseconds of a single enqueue spent waiting for its commit to reach the disk: the
    median enqueue on a session with ``synchronous_commit`` on, less the median with it off,
    in alternating blocks on one connection (never below zero)."""
    timed: dict[str, list[float]] = {"on": [], "off": []}
    with contextlib.closing(app.broker.connect()) as conn:
        for block in range(FLUSH_BLOCKS):
            mode = "on" if block % 2 == 0 else "off"
            conn.execute(f"SET synchronous_commit = {mode}")
            for i in range(samples // FLUSH_BLOCKS):
                t = time.perf_counter()
                noop.apply_async((i,), connection=conn)
                timed[mode].append(time.perf_counter() - t)
    return max(0.0, (percentile(timed["on"], 50) - percentile(timed["off"], 50)) * 1000)


def enqueue_one_by_one(n: int, progress: Progress) -> dict[str, Any]:
    t0 = time.perf_counter()
    for i in range(n):
        noop.delay(i)
        progress.status(f"enqueue (delay) {_bar(i + 1, n)}")
    seconds = time.perf_counter() - t0
    rate = _rate(n, seconds)
    progress.status("enqueue: timing the commit's flush")
    flush = commit_flush_ms()
    progress.result(
        f"enqueue one by one: {rate:,.0f} tasks/s ({n:,} x delay); the commit's flush to disk "
        f"takes {flush:.3f} ms of each {1000 / rate:.3f} ms"
    )
    return {"tasks": n, "seconds": seconds, "tasks_per_second": rate, "commit_flush_ms": flush}


def enqueue_bulk(n: int, progress: Progress) -> dict[str, Any]:
    t0 = time.perf_counter()
    for start in range(0, n, BATCH):
        stop = min(start + BATCH, n)
        noop.apply_many([(i,) for i in range(start, stop)])
        progress.status(f"bulk enqueue {_bar(stop, n)}")
    seconds = time.perf_counter() - t0
    rate = _rate(n, seconds)
    progress.result(f"bulk enqueue: {rate:,.0f} tasks/s ({n:,} in batches of {BATCH})")
    return {"tasks": n, "batch": BATCH, "seconds": seconds, "tasks_per_second": rate}


def burn_down(
    n: int, workers: Workers, progress: Progress, task: Task[Any, Any] = noop
) -> dict[str, Any]:
    """N calls of ``task`` made visible at once, timed until none is waiting or running."""
    with contextlib.closing(app.broker.connect(autocommit=False)) as conn:
        for start in range(0, n, BATCH):
            stop = min(start + BATCH, n)
            task.apply_many([(i,) for i in range(start, stop)], connection=conn)
            progress.status(f"burn-down: preparing {_bar(stop, n)}")
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
            progress.status(f"burn-down {_bar(n - left, n)}  {(n - left) / elapsed:,.0f} tasks/s")
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
    rate = _rate(n, seconds)
    cost = meter.stop(n)
    progress.result(f"burn-down: {rate:,.0f} tasks/s ({n:,} tasks in {seconds:.2f} s)")
    return {"tasks": n, "seconds": seconds, "tasks_per_second": rate, **cost}


def latency(
    samples: int,
    rate: float,
    workers: Workers,
    progress: Progress,
    task: Task[Any, Any] = stamp,
) -> dict[str, Any]:
    """Paced ``delay()`` calls on idle workers; start minus send, in milliseconds. Each sample
    is also split in two: the ``delay()`` call itself (its statement and its commit, flush to
    disk included) and the time from its return to the task's start, negative where the task
    started before the call returned."""
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
        progress.status(f"latency {_bar(i + 1, samples)} sent at {rate:g}/s")
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


def latency_split(values: Sequence[float], calls: Sequence[float]) -> dict[str, float]:
    """Percentiles of the ``delay()`` calls (``calls``, ms) and of what each sample's latency
    (``values``, ms, in the same order) left after its call: the time from the call's return
    to the task's start, negative where the task started first (a task handed to a waiting
    worker starts as its row commits, while the call waits for the flush to disk)."""
    after = [value - call for value, call in zip(values, calls, strict=True)]
    return {
        "call_p50_ms": percentile(calls, 50),
        "call_p99_ms": percentile(calls, 99),
        "after_return_p50_ms": percentile(after, 50),
        "after_return_p99_ms": percentile(after, 99),
    }


def keeping_up(windows: Sequence[dict[str, Any]], rate: float) -> dict[str, Any]:
    """Whether the workers kept up with the offered ``rate`` over the steady phase's windows:
    the rate they finished at in the second half, the tasks sent and not yet finished at the
    end, and ``kept_up`` when those were at most KEPT_UP_SECONDS of the offered load."""
    finished = _finished_rate(windows[len(windows) // 2 :])
    backlog = int(windows[-1]["unfinished"])
    kept_up = backlog <= rate * KEPT_UP_SECONDS
    return {
        "finished_per_second_second_half": finished,
        "unfinished_at_end": backlog,
        "kept_up": kept_up,
        # A rate to try next where they fell behind: a share of what they finished.
        "suggested_rate": None if kept_up else _round_down(STEADY_SHARE * finished),
    }


def _finished_rate(windows: Sequence[dict[str, Any]]) -> float:
    """The mean of ``windows``' finished-per-second rates."""
    return float(sum(w["finished_per_second"] for w in windows)) / len(windows)


def _round_down(value: float) -> int:
    """``value`` rounded down to two significant figures, and at least 1: 9,858 -> 9,800."""
    if value < 1:
        return 1
    step = int(10 ** max(0, len(str(int(value))) - 2))
    return int(value // step) * step


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
    broker = app.broker
    stamping = bench_tasks(opts.pool)[1]
    vacuum_off = broker.autovacuum_off()
    with started_workers(opts, progress, env) as workers, held_snapshot(opts) as held:
        stamping.delay(0.0).get(timeout=30)  # warm-up
        since = broker.bench_cost_sample()["now"]
        vacuums_before, checkpoints_before = broker.bench_maintenance()
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
                row = broker.bench_steady_window(since)
                if row["done"]:
                    since = row["last_done"]
                finished += row["done"]
                p50, p99 = row["ms"] or (None, None)
                vacuums, checkpoints = broker.bench_maintenance()
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
                    f"{label} {_bar(int(now - t0), int(seconds))} s  "
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
        _plural(report[key], word)
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
    rate = _finished_rate(measured)
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
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
        conn.execute("SELECT txid_current()")  # an xid and a snapshot, kept until rollback
        try:
            yield True
        finally:
            conn.rollback()


# -- the run ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _bench_settings(opts: Options) -> Iterator[None]:
    """Point this process's bench app at the run's database and schema.

    ``PGTASKS_*`` variables win over code-given settings, so they are set for the run (a
    ``PGTASKS_SCHEMA_NAME`` meant for the user's app must not lead the bench to its schema).
    """
    names = ("PGTASKS_DATABASE_URL", "PGTASKS_SCHEMA_NAME")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(PGTASKS_DATABASE_URL=opts.database_url, PGTASKS_SCHEMA_NAME=opts.schema)
    app.close()
    app.conf.update(broker_url=opts.database_url, schema_name=opts.schema)
    try:
        yield
    finally:
        app.close()
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def prepare_schema(opts: Options) -> None:
    """Create the bench schema fresh; refuse one the bench did not create unless ``force``."""
    broker = app.broker
    state = broker.bench_schema_state()
    if state == "other" and not opts.force:
        raise BenchError(
            f"schema {opts.schema!r} exists and was not created by pgtasks bench: "
            "pick another with --schema, or pass --force to drop it and everything in it"
        )
    if state != "absent":
        broker.drop_schema()
    broker.create_bench_schema()
    migrate(app.database_url, opts.schema)


def run(opts: Options, progress: Progress | None = None) -> dict[str, Any]:
    """Run the selected phases; returns the report (``setup`` and ``phases``)."""
    check_options(opts)
    progress = progress or Progress()
    phases: dict[str, Any] = {}
    with _bench_settings(opts):
        broker = app.broker
        broker.connect().close()  # fails fast, where the pool would retry for a while
        setup = {
            "postgresql": broker.server_version(),
            "pgtasks": __version__,
            "pool": opts.pool,
            "workers": opts.workers,
            "concurrency": opts.concurrency,
            "tasks": opts.tasks,
            "schema": opts.schema,
        }
        prepare_schema(opts)
        try:
            _run_phases(opts, progress, phases)
        except BaseException:
            progress.clear()
            if not opts.keep:
                # The first error is the one to report: a failing clean-up must not hide it.
                with contextlib.suppress(Exception):
                    app.broker.drop_schema()
            raise
        if opts.keep:
            progress.result(f"kept schema {opts.schema!r}")
        else:
            app.broker.drop_schema()
    return {"setup": setup, "phases": phases}


def _run_phases(opts: Options, progress: Progress, phases: dict[str, Any]) -> None:
    """The selected phases, in order; each adds its figures to ``phases``."""
    if "enqueue" in opts.phases:
        phases["enqueue"] = enqueue_one_by_one(opts.one_by_one, progress)
        phases["bulk_enqueue"] = enqueue_bulk(opts.tasks, progress)
        app.broker.purge()  # the workers must find only the burn-down's tasks
    if "burn-down" in opts.phases or "latency" in opts.phases:
        no_op, stamping = bench_tasks(opts.pool)
        with started_workers(opts, progress) as workers:
            if "burn-down" in opts.phases:
                phases["burn_down"] = burn_down(opts.tasks, workers, progress, no_op)
            if "latency" in opts.phases:
                phases["latency"] = latency(
                    opts.latency_samples, opts.rate, workers, progress, stamping
                )
    load = [p for p in ("capacity", "steady") if p in opts.phases]
    if load and opts.window < WINDOW:
        progress.result(short_windows_warning(opts.window, load))
    if "capacity" in opts.phases:
        app.broker.purge()
        phases["capacity"] = capacity(opts, progress)
    if "steady" in opts.phases:
        rate = opts.steady_rate
        if rate is None:
            measured = phases.get("capacity") or phases.get("burn_down")
            if measured is None:
                raise BenchError(
                    "give --steady-rate, or run the capacity (or burn-down) phase to take "
                    f"{STEADY_SHARE:.0%} of it"
                )
            rate = STEADY_SHARE * measured["tasks_per_second"]
        app.broker.purge()
        phases["steady"] = steady(opts, rate, progress)


def short_windows_warning(window: float, phases: Sequence[str]) -> str:
    """What a run with windows shorter than WINDOW says before its load ``phases``."""
    return (
        f"warning: the {' and '.join(phases)} figures come from windows of {window:g} s, "
        f"shorter than the {WINDOW:g} s default: each holds few tasks, and a worker's start, "
        "a vacuum or a checkpoint can fill one, so they do not measure the queue; short windows "
        "only check that the bench runs on this database"
    )


# -- the report -------------------------------------------------------------------------------


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(phase, value, unit) for each measured figure."""
    phases = report["phases"]
    rows: list[tuple[str, str, str]] = []
    if "enqueue" in phases:
        rows.append(
            ("enqueue one by one", f"{phases['enqueue']['tasks_per_second']:,.0f}", "tasks/s")
        )
        flush = phases["enqueue"].get("commit_flush_ms")
        if flush is not None:
            rows.append(("commit flush per enqueue", f"{flush:.3f}", "ms"))
    if "bulk_enqueue" in phases:
        rows.append(
            ("bulk enqueue", f"{phases['bulk_enqueue']['tasks_per_second']:,.0f}", "tasks/s")
        )
    if "burn_down" in phases:
        rows.append(("burn-down", f"{phases['burn_down']['tasks_per_second']:,.0f}", "tasks/s"))
    if "latency" in phases:
        lat = phases["latency"]
        for p in ("p50", "p90", "p99"):
            rows.append((f"delay->start {p}", f"{lat[f'{p}_ms']:.2f}", "ms"))
        for key, label in (("call", "delay() call"), ("after_return", "start after return")):
            for p in ("p50", "p99"):
                value = lat.get(f"{key}_{p}_ms")
                if value is not None:
                    rows.append((f"{label} {p}", f"{value:.2f}", "ms"))
    if "capacity" in phases:
        rows.append(
            (
                "capacity, enqueueing alongside",
                f"{phases['capacity']['tasks_per_second']:,.0f}",
                "tasks/s",
            )
        )
    if "steady" in phases:
        st = phases["steady"]
        rows.append(("steady offered load", f"{st['offered_per_second']:,.0f}", "tasks/s"))
        rows.append(
            (
                "steady finished, second half",
                f"{st['finished_per_second_second_half']:,.0f}",
                "tasks/s",
            )
        )
        rows.append(
            (
                "steady unfinished at the end",
                f"{st['unfinished_at_end']:,}",
                "tasks" + ("" if st["kept_up"] else " (fell behind)"),
            )
        )
        for half in ("first", "second"):
            value = st[f"p99_ms_{half}_half"]
            if value is not None:
                rows.append((f"steady p99, {half} half", f"{value:.2f}", "ms"))
        rows.append(("steady tables, largest", f"{st['size_mb_max']:,.0f}", "MB"))
    for key, label in (("burn_down", "burn-down"), ("capacity", "capacity"), ("steady", "steady")):
        figures = phases.get(key, {})
        if figures.get("wal_bytes_per_task") is not None:
            rows.append((f"{label} WAL per task", f"{figures['wal_bytes_per_task']:,.0f}", "bytes"))
        whose = [("worker_cpu", "worker"), ("db_cpu", "server")]
        if key != "burn_down":
            whose.append(("bench_cpu", "enqueuer"))
        for cpu_key, who in whose:
            value = figures.get(f"{cpu_key}_ms_per_1000_tasks")
            if value is not None:
                rows.append((f"{label} {who} CPU per 1,000 tasks", f"{value:,.0f}", "ms"))
    return rows


#: The columns of a load phase's window table: heading, and the cell of one window.
_WINDOW_COLUMNS: tuple[tuple[str, Callable[[dict[str, Any]], str]], ...] = (
    ("AT", lambda w: f"{w['at_s']:.0f} s"),
    ("SENT/S", lambda w: f"{w['sent_per_second']:,.0f}"),
    ("FINISHED/S", lambda w: f"{w['finished_per_second']:,.0f}"),
    ("P50 MS", lambda w: "-" if w["p50_ms"] is None else f"{w['p50_ms']:.1f}"),
    ("P99 MS", lambda w: "-" if w["p99_ms"] is None else f"{w['p99_ms']:.1f}"),
    ("WAITING", lambda w: f"{w['unfinished']:,}"),
    ("TABLES MB", lambda w: f"{w['tasks_mb'] + w['results_mb'] + w['attempts_mb']:,.0f}"),
    ("VACUUMS", lambda w: str(w["vacuums"])),
    ("CHECKPOINTS", lambda w: str(w["checkpoints"])),
)


def window_table(
    label: str, windows: Sequence[dict[str, Any]], window: float = WINDOW
) -> list[str]:
    """A load phase's windows as a table: what was sent and finished a second, the latency
    from send to start of the tasks finished in each, what was waiting at its end, the size
    of the tables with their indexes, and the vacuums and checkpoints that finished in it.
    ``window`` is their length in seconds (the times they end in tenths where it is not whole)."""
    columns = list(_WINDOW_COLUMNS)
    if not float(window).is_integer():
        columns[0] = ("AT", lambda w: f"{w['at_s']:.1f} s")
    rows = [[head for head, _ in columns]]
    rows += [[cell(w) for _, cell in columns] for w in windows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(columns))]
    return [f"{label}, every {window:g} s:"] + [
        "  ".join(cell.rjust(width) for cell, width in zip(row, widths, strict=True))
        for row in rows
    ]


def format_report(report: dict[str, Any]) -> str:
    """The summary table, the windows of the load phases, and the setup it was measured on."""
    rows = [("PHASE", "VALUE", "UNIT"), *summary_rows(report)]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = [
        f"{phase.ljust(widths[0])}  {value.rjust(widths[1])}  {unit}".rstrip()
        for phase, value, unit in rows
    ]
    for key in ("capacity", "steady"):
        phase = report["phases"].get(key, {})
        if phase.get("windows"):
            lines.append("")
            lines.extend(window_table(key, phase["windows"], phase.get("window_seconds", WINDOW)))
    s = report["setup"]
    lines.append("")
    lines.append(
        f"PostgreSQL {s['postgresql']}, pgtasks {s['pgtasks']}, "
        f"{_plural(s['workers'], 'worker')} x {_plural(s['concurrency'], 'slot')} "
        f"({s['pool']} pool), {s['tasks']:,} tasks"
    )
    return "\n".join(lines)


def parse_phases(value: str | None) -> list[str]:
    """``--only``'s comma-separated list, in the order the phases run."""
    if not value:
        return list(DEFAULT_PHASES)
    wanted = {v.strip() for v in value.split(",") if v.strip()}
    unknown = wanted - set(PHASES)
    if unknown:
        raise BenchError(f"unknown phase {sorted(unknown)[0]!r}: choose from {', '.join(PHASES)}")
    return [p for p in PHASES if p in wanted]
