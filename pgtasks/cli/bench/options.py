"""What a run of ``pgtasks bench`` is asked for: its options, the phases and their defaults,
and the error it stops with."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from pgtasks.exceptions import PgTasksError

#: The schema a run creates, works in and drops.
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
#: Calls per ``apply_many()`` wherever the bench enqueues in bulk.
BATCH = 1000
#: How often the burn-down looks for its end (seconds), and how often it counts what is left.
POLL = 0.05
COUNT_EVERY = 0.5
#: Waiting and running tasks the capacity phase keeps in the queue: seconds of work for one
#: worker slot, a fraction of a second for the queue's whole rate.
CAPACITY_BACKLOG = 5000


class BenchError(PgTasksError):
    """The benchmark cannot run or did not finish."""


@dataclass
class Options:
    """A run's options, as ``pgtasks bench`` takes them (its defaults are these)."""

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


def parse_phases(value: str | None) -> list[str]:
    """``--only``'s comma-separated list, in the order the phases run."""
    if not value:
        return list(DEFAULT_PHASES)
    wanted = {v.strip() for v in value.split(",") if v.strip()}
    unknown = wanted - set(PHASES)
    if unknown:
        raise BenchError(f"unknown phase {sorted(unknown)[0]!r}: choose from {', '.join(PHASES)}")
    return [p for p in PHASES if p in wanted]
