"""The adaptive prefetch: how many rows a worker claims beyond its free slots.

A pure policy, fed the run times of the calls that ended and what each claim found; the
worker asks it how many rows to hold ahead before each claim. Holding about ``window`` seconds
of work lets short tasks be claimed many per statement while long ones are never hoarded."""

from __future__ import annotations

from collections import deque


class AdaptivePrefetch:
    """Rows to hold beyond the free slots: about ``window`` seconds of work a slot at the
    tasks' measured run time, more through a backlog, within a bound."""

    #: The most rows a slot holds, however short the tasks: a claim of a few hundred rows
    #: costs the database far less per row than one of a hundred (the claim statement's fixed
    #: part), and a misjudged run time holds back no more than this. A worker of fewer than
    #: four slots may hold up to PER_WORKER rows in all.
    PER_SLOT = 250
    PER_WORKER = 1000
    #: How far the window grows while claims come back full (a backlog): up to this many
    #: times ``window``, doubling with each full claim, back to one at the first claim that
    #: finds fewer rows than it asked for.
    GROWTH = 4
    #: How many recent run times the prefetch is sized by (their median; see runtime).
    SAMPLES = 32

    def __init__(self, concurrency: int, window: float) -> None:
        self.concurrency = concurrency
        #: Seconds of work to hold ahead; 0 holds nothing beyond the free slots.
        self.window = window
        self._growth = 1
        self._ewma: float | None = None
        self._samples: deque[float] = deque(maxlen=self.SAMPLES)

    def ran(self, seconds: float) -> None:
        """A call that ran ``seconds`` ended."""
        previous = self._ewma
        self._ewma = seconds if previous is None else previous * 0.9 + seconds * 0.1
        self._samples.append(seconds)

    def claimed(self, want: int, taken: int) -> None:
        """A claim asked for ``want`` rows and took ``taken``. A claim that got every row it
        asked for leaves more due behind it: through such a backlog the window doubles, up to
        GROWTH times, so that each claim statement (whose fixed part the database pays per
        statement) serves several times more rows. The first claim that finds fewer brings it
        back, so a burst of a few tasks spreads over the workers that wait for it instead of
        going to the first one to claim."""
        if taken >= want:
            self._growth = min(self._growth * 2, self.GROWTH)
        else:
            self._growth = 1

    @property
    def runtime(self) -> float | None:
        """A call's run time as the prefetch is sized by (None before any ended): the median
        of the last SAMPLES, so that the few calls a hundred that wait milliseconds for a core
        or a reply leave it as it is (through their average, each such call shrank the
        prefetch, and the claim that refills it came too late to keep the slots busy); but
        never less than a quarter of the running average, so that one long call shrinks it at
        once, and where a few tasks in many run long, the rows held ahead never add up to more
        than about four windows of work at their average run time."""
        ewma = self._ewma
        if ewma is None or not self._samples:
            return ewma
        median = sorted(self._samples)[len(self._samples) // 2]
        return max(median, ewma / 4)

    def rows(self) -> int:
        """Rows to hold beyond the free slots now."""
        runtime = self.runtime
        if runtime is None or self.window <= 0:
            return 0
        window = self.window * self._growth
        per_slot = int(window / max(runtime, 1e-4))
        bound = max(self.PER_WORKER, self.concurrency * self.PER_SLOT)
        return min(self.concurrency * per_slot, bound)
