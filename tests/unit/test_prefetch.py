"""The adaptive prefetch: how many rows a worker claims beyond its free slots."""

from __future__ import annotations

import pytest

from pgtasks import Celery
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
        (0.0001, 250),
        (0.00001, 250),
    ],
)
def test_about_a_window_of_work_a_slot_up_to_a_bound(runtime: float, per_slot: int) -> None:
    w = worker(4)
    w._runtime_ewma = runtime
    assert Worker.PREFETCH_PER_SLOT == 250
    assert w._adaptive_prefetch() == 4 * per_slot
