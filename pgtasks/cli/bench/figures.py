"""Arithmetic on what the phases measure: percentiles, rates, and whether the workers kept up.
Pure functions, the numbers the report is made of."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pgtasks.cli.bench.options import KEPT_UP_SECONDS, STEADY_SHARE


def percentile(values: Sequence[float], p: float) -> float:
    """The ``p``-th percentile, interpolated between the closest ranks."""
    ordered = sorted(values)
    k = (len(ordered) - 1) * p / 100
    lo = int(k)
    hi = min(lo + 1, len(ordered) - 1)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def per_second(n: int, seconds: float) -> float:
    """``n`` over ``seconds``: a rate (infinite for no time at all)."""
    return n / seconds if seconds > 0 else float("inf")


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
    finished = finished_rate(windows[len(windows) // 2 :])
    backlog = int(windows[-1]["unfinished"])
    kept_up = backlog <= rate * KEPT_UP_SECONDS
    return {
        "finished_per_second_second_half": finished,
        "unfinished_at_end": backlog,
        "kept_up": kept_up,
        # A rate to try next where they fell behind: a share of what they finished.
        "suggested_rate": None if kept_up else round_down(STEADY_SHARE * finished),
    }


def finished_rate(windows: Sequence[dict[str, Any]]) -> float:
    """The mean of ``windows``' finished-per-second rates."""
    return float(sum(w["finished_per_second"] for w in windows)) / len(windows)


def round_down(value: float) -> int:
    """``value`` rounded down to two significant figures, and at least 1: 9,858 -> 9,800."""
    if value < 1:
        return 1
    step = int(10 ** max(0, len(str(int(value))) - 2))
    return int(value // step) * step
