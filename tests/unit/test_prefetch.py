"""The adaptive prefetch: how many rows a worker claims beyond its free slots."""

from __future__ import annotations

import pytest

from pgtasks import Celery
from pgtasks.worker.execute import SUCCESS, Outcome
from pgtasks.worker.pools import Pool
from pgtasks.worker.worker import Worker


def worker(concurrency: int, window: float = 0.05) -> Worker:
    app = Celery("prefetch", broker="postgresql://unused/none")
    w = Worker(app, pool="threads", concurrency=concurrency)
    w.prefetch_window = window
    return w


def test_nothing_is_prefetched_before_a_run_time_is_known_or_with_no_window() -> None:
    assert worker(2)._adaptive_prefetch() == 0
    w = worker(2, window=0.0)
    w._runtime_ewma = 0.001
    assert w._adaptive_prefetch() == 0


@pytest.mark.parametrize(
    ("runtime", "per_slot"),
    [
        (1.0, 0),  # longer than the window: no row beyond the free slots
        (0.01, 5),
        (0.001, 50),
        # Short tasks: a few hundred rows a slot, never more than PREFETCH_PER_SLOT.
        (0.0001, Worker.PREFETCH_PER_SLOT),
        (0.00001, Worker.PREFETCH_PER_SLOT),
    ],
)
def test_about_a_window_of_work_a_slot_up_to_a_bound(runtime: float, per_slot: int) -> None:
    w = worker(4)
    w._runtime_ewma = runtime
    assert w._adaptive_prefetch() == 4 * per_slot


def test_a_worker_of_few_slots_may_hold_up_to_a_worker_bound() -> None:
    w = worker(1)
    w._runtime_ewma = 0.0001
    # 50 ms of 0.1 ms tasks: 500 rows, more than one slot's bound but within the worker's.
    assert w._adaptive_prefetch() == 500
    w._claimed(want=1, taken=1)  # a backlog: 100 ms of work, 1000 rows, the worker's bound
    w._claimed(want=1, taken=1)  # 200 ms: still 1000
    assert w._adaptive_prefetch() == Worker.PREFETCH_PER_WORKER == 1000
    # Four slots or more: each slot's own bound, as before.
    w = worker(8)
    w._runtime_ewma = 0.0001
    w._claimed(want=1, taken=1)
    assert w._adaptive_prefetch() == 8 * Worker.PREFETCH_PER_SLOT


def test_the_window_grows_through_a_backlog_and_shrinks_when_a_claim_comes_back_short() -> None:
    w = worker(1)
    w._runtime_ewma = 0.001  # 50 rows in 50 ms
    assert w._adaptive_prefetch() == 50
    sizes = []
    for _ in range(4):
        w._claimed(want=10, taken=10)  # full: more is due
        sizes.append(w._adaptive_prefetch())
    # Doubling with each full claim, up to PREFETCH_GROWTH times the window.
    top = 50 * Worker.PREFETCH_GROWTH
    assert sizes == [min(100, top), min(200, top), min(400, top), min(800, top)]
    w._claimed(want=10, taken=3)  # short: the queue ran dry
    assert w._adaptive_prefetch() == 50
    w._claimed(want=10, taken=10)
    assert w._adaptive_prefetch() == 100


def _ran(w: Worker, runtime: float) -> None:
    """A call of ``runtime`` seconds ends (one this worker no longer holds: only its run time
    is taken)."""
    if not hasattr(w, "pool"):
        w.pool = Pool(w.app, w.concurrency)  # none started: nothing waits in it
    w._done(Outcome("gone", 1, SUCCESS, 0.0, runtime))


def test_a_few_slow_calls_leave_the_prefetch_as_it_was() -> None:
    # Calls of 0.1 ms, with one in twenty waiting 2 ms for a core or a reply: sized by their
    # average, the prefetch would shrink to a third, and refill too late to keep the slot busy.
    w = worker(1)
    for i in range(200):
        _ran(w, 0.002 if i % 20 == 19 else 0.0001)
    assert w._adaptive_prefetch() == 500
    assert w._runtime_ewma is not None and w._runtime_ewma > 0.0001 * 2


def test_one_long_call_shrinks_the_prefetch_at_once() -> None:
    w = worker(1)
    for _ in range(100):
        _ran(w, 0.0001)
    assert w._adaptive_prefetch() == 500
    _ran(w, 1.0)  # the tasks turn long: hold no more than a few of them
    assert w._adaptive_prefetch() <= 4


def test_a_few_long_tasks_among_short_ones_keep_the_prefetch_small() -> None:
    # One task in ten runs a second: the median is the short ones', but the rows held ahead
    # would then hold about a second of work each; the average keeps them to a few.
    w = worker(1)
    for i in range(100):
        _ran(w, 1.0 if i % 10 == 9 else 0.0001)
    assert w._adaptive_prefetch() <= 2
