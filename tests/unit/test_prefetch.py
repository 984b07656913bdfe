"""The adaptive prefetch: how many rows a worker claims beyond its free slots (the bounds are
the documented ones: about ``prefetch_window`` of work, at most 250 rows a slot or 1,000 a
worker of fewer slots, up to four windows through a backlog)."""

from __future__ import annotations

from typing import Any

import pytest

from pgtasks import Celery
from pgtasks.worker.prefetch import AdaptivePrefetch
from pgtasks.worker.worker import Worker


def prefetch(
    concurrency: int, runtime: float | None = None, window: float = 0.05
) -> AdaptivePrefetch:
    """A prefetch whose calls (if ``runtime``) have all run ``runtime`` seconds."""
    p = AdaptivePrefetch(concurrency, window)
    if runtime is not None:
        p.ran(runtime)
    return p


def test_a_worker_sizes_its_prefetch_by_its_settings() -> None:
    app = Celery("prefetch", broker="postgresql://unused/none", prefetch_window=0.2)
    w = Worker(app, pool="threads", concurrency=3)
    assert (w.prefetch.concurrency, w.prefetch.window) == (3, 0.2)
    assert w.prefetch.rows() == 0


def test_nothing_is_prefetched_before_a_run_time_is_known_or_with_no_window() -> None:
    assert prefetch(2).rows() == 0
    assert prefetch(2).runtime is None
    assert prefetch(2, 0.001, window=0.0).rows() == 0


@pytest.mark.parametrize(
    ("runtime", "per_slot"),
    [
        (1.0, 0),  # longer than the window: no row beyond the free slots
        (0.01, 5),
        (0.001, 50),
        # Short tasks: a few hundred rows a slot, however short.
        (0.0001, 250),
        (0.00001, 250),
    ],
)
def test_about_a_window_of_work_a_slot_up_to_a_bound(runtime: float, per_slot: int) -> None:
    assert prefetch(4, runtime).rows() == 4 * per_slot


def test_a_worker_of_few_slots_may_hold_up_to_a_worker_bound() -> None:
    p = prefetch(1, 0.0001)
    # 50 ms of 0.1 ms tasks: 500 rows, more than one slot's bound but within the worker's.
    assert p.rows() == 500
    p.claimed(want=1, taken=1)  # a backlog: 100 ms of work, 1000 rows, the worker's bound
    assert p.rows() == 1000
    p.claimed(want=1, taken=1)  # 200 ms: still 1000
    assert p.rows() == 1000
    # Four slots or more: each slot's own bound, as before.
    p = prefetch(8, 0.0001)
    p.claimed(want=1, taken=1)
    assert p.rows() == 8 * 250


def test_the_window_grows_through_a_backlog_and_shrinks_when_a_claim_comes_back_short() -> None:
    p = prefetch(1, 0.001)  # 50 rows in 50 ms
    assert p.rows() == 50
    sizes = []
    for _ in range(4):
        p.claimed(want=10, taken=10)  # full: more is due
        sizes.append(p.rows())
    # Doubling with each full claim, up to four windows.
    assert sizes == [100, 200, 200, 200]
    p.claimed(want=10, taken=3)  # short: the queue ran dry
    assert p.rows() == 50
    p.claimed(want=10, taken=10)
    assert p.rows() == 100


def test_a_few_slow_calls_leave_the_prefetch_as_it_was() -> None:
    # Calls of 0.1 ms, with one in twenty waiting 2 ms for a core or a reply: sized by their
    # average, the prefetch would shrink to a third, and refill too late to keep the slot busy.
    p = prefetch(1)
    for i in range(200):
        p.ran(0.002 if i % 20 == 19 else 0.0001)
    assert p.rows() == 500


def test_one_long_call_shrinks_the_prefetch_at_once() -> None:
    p = prefetch(1)
    for _ in range(100):
        p.ran(0.0001)
    assert p.rows() == 500
    p.ran(1.0)  # the tasks turn long: hold no more than a few of them
    assert p.rows() <= 4


def test_a_few_long_tasks_among_short_ones_keep_the_prefetch_small() -> None:
    # One task in ten runs a second: the median is the short ones', but the rows held ahead
    # would then hold about a second of work each; the average keeps them to a few.
    p = prefetch(1)
    for i in range(100):
        p.ran(1.0 if i % 10 == 9 else 0.0001)
    assert p.rows() <= 2


def test_a_worker_sizes_its_prefetch_by_the_calls_it_runs(app: Celery, worker_factory: Any) -> None:
    @app.task(name="prefetch.quick")
    def quick() -> int:
        return 1

    with worker_factory(pool="threads", concurrency=1) as w:
        assert w.prefetch.runtime is None
        assert quick.delay().get(timeout=10) == 1
        # Measured as the call ended, before its result was written.
        assert w.prefetch.runtime is not None
        assert w.prefetch.rows() > 0
