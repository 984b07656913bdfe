"""Where a worker's claims start reading the claim index.

A claim reads the claim index ``(queue, priority DESC, run_at, created_at) WHERE status =
'PENDING'`` from the front of each queue, and the front normally holds due rows: the entries of
claimed rows are marked dead by the first scan that passes them and removed by vacuum. While a
transaction elsewhere keeps an old snapshot open (a long report, a session idle in transaction,
a backup), neither can happen: every row claimed since still has its entry, and each claim
walks past all of them, with a visit to the table for each. Claims slow down in proportion to
the work done since the snapshot was taken, until the queue stalls.

So when a full claim gets slow, the worker starts its claims from *floors*: for each queue and
priority it has claimed from, the ``run_at`` of the latest row it claimed there. The index
search itself starts at the floor, so the entries behind it cost nothing. The priority ranges
around the known ones are still read in full (a new priority is found at once, and no claim of
this worker left entries there).

A row can become due behind a floor: an enqueue committed long after its transaction began
(``run_at`` is the transaction's ``now()``), an eta in the past, a reclaimed or released row, a
claim by another worker that rolled back. A full claim every ``probe_every`` seconds finds
them: at least ``min_probe_every``, and at least ``probe_cost_factor`` times what the last full
claim took, so full claims never take more than a small share of the worker's time. The worker
goes back to full claims as soon as one is fast again. Floors cost nothing until then.

The reclaimer and the pruner (pgtasks.maintenance) scan the lease and retention indexes the same
way, with the same ``Gate``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Protocol

#: The range of the ``priority`` column (a 32-bit integer).
PRIORITY_MIN = -(2**31)
PRIORITY_MAX = 2**31 - 1


class _Claimed(Protocol):
    @property
    def queue(self) -> str: ...

    @property
    def priority(self) -> int: ...

    @property
    def run_at(self) -> datetime: ...


@dataclass(frozen=True)
class FloorPlan:
    """The arguments of one claim from floors (query ``claim_batch_from_floors``)."""

    band_queues: list[str]
    band_priorities: list[int]
    band_floors: list[datetime]
    gap_queues: list[str]
    gap_lows: list[int]
    gap_highs: list[int]

    def params(self) -> dict[str, object]:
        return {
            "band_queues": self.band_queues,
            "band_priorities": self.band_priorities,
            "band_floors": self.band_floors,
            "gap_queues": self.gap_queues,
            "gap_lows": self.gap_lows,
            "gap_highs": self.gap_highs,
        }


@dataclass
class Gate:
    """Whether a scan may start from a floor: only after a full scan was slow, and with a full
    scan again every ``min_full_every`` seconds and at least every ``cost_factor`` times what the
    last one took. A fast full scan turns floors off. Times are monotonic seconds."""

    slow: float
    min_full_every: float
    cost_factor: float = 50.0
    active: bool = False
    next_full: float = 0.0

    def full_due(self, now: float) -> bool:
        return not self.active or now >= self.next_full

    def full_done(self, elapsed: float, now: float) -> None:
        """A full scan took ``elapsed`` seconds."""
        self.active = elapsed >= self.slow
        if self.active:
            self.next_full = now + max(self.min_full_every, self.cost_factor * elapsed)


@dataclass
class Floors:
    """One worker's claim floors, and when it claims in full instead (see the module docs).

    Not thread-safe: only the worker's claim loop uses it.
    """

    #: A full claim slower than this (seconds) turns floors on, with a full claim at least
    #: every second.
    gate: Gate = field(default_factory=lambda: Gate(slow=0.010, min_full_every=1.0))
    #: Known bands beyond this many are forgotten (and learnt again from the next claims).
    max_bands: int = 256
    _floors: dict[tuple[str, int], datetime] = field(default_factory=dict)

    @property
    def active(self) -> bool:
        return self.gate.active

    def plan(self, queues: Sequence[str], now: float) -> FloorPlan | None:
        """The floors to claim from, or None for a full claim (``now``: a monotonic time)."""
        if self.gate.full_due(now):
            return None
        bands: dict[str, list[int]] = {q: [] for q in queues}
        for queue, priority in self._floors:
            if queue in bands:
                bands[queue].append(priority)
        plan = FloorPlan([], [], [], [], [], [])
        for queue, priorities in bands.items():
            high = PRIORITY_MAX
            for priority in sorted(priorities, reverse=True):
                plan.band_queues.append(queue)
                plan.band_priorities.append(priority)
                plan.band_floors.append(self._floors[queue, priority])
                if priority < high:
                    _gap(plan, queue, priority + 1, high)
                high = priority - 1
            if high >= PRIORITY_MIN:
                _gap(plan, queue, PRIORITY_MIN, high)
        return plan

    def record(
        self,
        plan: FloorPlan | None,
        claimed: Sequence[_Claimed],
        elapsed: float,
        now: float,
    ) -> None:
        """Learn from a claim: its rows move the floors on; a full claim's duration decides
        whether floors are used until the next full claim."""
        if plan is None:
            self.gate.full_done(elapsed, now)
            if not self.gate.active:
                self._floors.clear()
                return
        if len(self._floors) > self.max_bands:
            self._floors.clear()
        floors = self._floors
        for row in claimed:
            key = (row.queue, row.priority)
            floor = floors.get(key)
            if floor is None or row.run_at > floor:
                floors[key] = row.run_at


def _gap(plan: FloorPlan, queue: str, low: int, high: int) -> None:
    if low <= high:
        plan.gap_queues.append(queue)
        plan.gap_lows.append(low)
        plan.gap_highs.append(high)
