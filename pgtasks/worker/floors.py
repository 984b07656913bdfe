"""Where a worker's claims start reading the claim index.

A claim reads the claim index ``(queue, priority DESC, run_at, created_at) WHERE status =
'PENDING'`` from the front of each queue, and the front normally holds due rows: the entries of
claimed rows are marked dead by the first scan that passes them and removed by vacuum. While a
transaction elsewhere keeps an old snapshot open (a long report, a session idle in transaction,
a backup), neither can happen: every row claimed since still has its entry, and each claim
walks past all of them, with a visit to the table for each. Claims slow down in proportion to
the work done since the snapshot was taken, until the queue stalls.

So when a full claim gets slow, the worker starts its claims from *floors*: for each queue and
priority it has claimed from, the ``run_at`` of the latest row it claimed there, less a margin
for enqueues that commit a little after their rows were stamped. The index search itself starts
at the floor, so the entries behind it cost nothing. The priority ranges around the known ones
are still read in full (a new priority is found at once, and no claim of this worker left
entries there).

A row can still become due behind a floor: an enqueue committed long after its transaction
began (``run_at`` is the transaction's ``now()``), an eta in the past, a released row, a claim
by another worker that rolled back. The worker's maintenance thread looks for such rows (a read
that walks the dead entries, off the claim path) at least every second and at least every 50
times what the last look took; when it finds one, that band's floor moves back to it. When a
look finds nothing and is fast again, vacuum has caught up: floors go off and claims are full
again. Until a full claim is slow, floors cost nothing.

The reclaimer and the pruner (pgtasks.maintenance) scan the lease and retention indexes the same
way, with the same ``Gate``.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Protocol

from pgtasks.broker import NEVER_BEFORE

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
    last one took, but at most ``max_full_every`` seconds after it (what a scan from a floor
    cannot see waits that long at most, however long the full scan took, or seemed to take: a
    wait for a connection while the server restarts counts in it too). A fast full scan turns
    floors off. Times are monotonic seconds."""

    slow: float
    min_full_every: float
    cost_factor: float = 50.0
    max_full_every: float = math.inf
    active: bool = False
    next_full: float = 0.0

    def full_due(self, now: float) -> bool:
        return not self.active or now >= self.next_full

    def full_done(self, elapsed: float, now: float) -> None:
        """A full scan took ``elapsed`` seconds."""
        self.active = elapsed >= self.slow
        if self.active:
            wait = max(self.min_full_every, self.cost_factor * elapsed)
            self.next_full = now + min(wait, self.max_full_every)


@dataclass
class Floors:
    """One worker's claim floors, and when it claims in full instead (see the module docs).

    The claim loop calls ``plan`` and ``record``; the maintenance thread calls ``probe_plan``
    and ``probe_done``.
    """

    #: A full claim slower than this (seconds) turns floors on; the probe for rows behind the
    #: floors runs at least every second.
    gate: Gate = field(default_factory=lambda: Gate(slow=0.010, min_full_every=1.0))
    #: Claims start this far behind the latest row claimed in each band: enqueues commit a
    #: little after the now() their rows were stamped with, and other producers' rows may have
    #: been claimed meanwhile.
    margin: timedelta = timedelta(seconds=0.25)
    #: Known bands beyond this many are forgotten (and learnt again from the next claims).
    max_bands: int = 256
    _floors: dict[tuple[str, int], datetime] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def active(self) -> bool:
        return self.gate.active

    def plan(self, queues: Sequence[str]) -> FloorPlan | None:
        """The floors to claim from, or None for a full claim."""
        with self._lock:
            if not self.gate.active:
                return None
            return self._plan(queues, gaps=True)

    def record(
        self,
        plan: FloorPlan | None,
        claimed: Sequence[_Claimed],
        elapsed: float,
        now: float,
    ) -> None:
        """Learn from a claim: its rows move the floors on; a full claim's duration decides
        whether floors are used from now on (``now``: a monotonic time)."""
        with self._lock:
            if plan is None:
                self.gate.full_done(elapsed, now)
                if not self.gate.active:
                    self._floors.clear()
                    return
            if len(self._floors) > self.max_bands:
                self._floors.clear()
            floors = self._floors
            for row in claimed:
                if not self._has_room_below(row.run_at):
                    # Nothing can be due before such a row, and a floor a margin below it
                    # cannot be written: it leaves the band's floor as it was.
                    continue
                key = (row.queue, row.priority)
                floor = floors.get(key)
                if floor is None or row.run_at > floor:
                    floors[key] = row.run_at

    def probe_plan(self, queues: Sequence[str], now: float) -> FloorPlan | None:
        """The bands to look behind when a probe is due (the gaps stay empty), else None."""
        with self._lock:
            if not self.gate.active or now < self.gate.next_full or not self._floors:
                return None
            return self._plan(queues, gaps=False)

    def probe_done(
        self, behind: dict[tuple[str, int], datetime], elapsed: float, now: float
    ) -> None:
        """The probe took ``elapsed`` seconds and found, per band, the earliest due row behind
        its floor. Such a band's floor moves back to that row, so the next claims take it (and
        walk only the entries after it). None found, and fast: vacuum keeps up again, floors
        off. (A probe that finds a row stops there, so then its speed says nothing.)"""
        with self._lock:
            gate = self.gate
            if not behind:
                gate.full_done(elapsed, now)
                if not gate.active:
                    self._floors.clear()
                return
            gate.next_full = now + max(gate.min_full_every, gate.cost_factor * elapsed)
            for key, run_at in behind.items():
                floor = self._floors.get(key)
                if floor is None:
                    continue
                if self._has_room_below(run_at):
                    self._floors[key] = min(floor, run_at + self.margin)
                else:
                    # A row at the calendar's start ('-infinity'): the band is read in full,
                    # as a gap, until claims learn its floor again.
                    del self._floors[key]

    def _has_room_below(self, moment: datetime) -> bool:
        """Whether a floor a margin below ``moment`` can be written."""
        return moment - NEVER_BEFORE > self.margin

    def _plan(self, queues: Sequence[str], gaps: bool) -> FloorPlan:
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
                plan.band_floors.append(self._floors[queue, priority] - self.margin)
                if gaps and priority < high:
                    _gap(plan, queue, priority + 1, high)
                high = priority - 1
            if gaps and high >= PRIORITY_MIN:
                _gap(plan, queue, PRIORITY_MIN, high)
        return plan


def _gap(plan: FloorPlan, queue: str, low: int, high: int) -> None:
    if low <= high:
        plan.gap_queues.append(queue)
        plan.gap_lows.append(low)
        plan.gap_highs.append(high)
