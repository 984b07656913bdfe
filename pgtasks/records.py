"""The value types the layers pass to each other: what a worker decided about a run (an
outcome), what a canvas operation writes (a plan), what maintenance did. Plain data, no
database: the stores turn them into statements."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, NamedTuple

from pgtasks.message import TaskMessage


@dataclass(unsafe_hash=True)
class Success:
    """A run that returned: the row is COMPLETED, its result stored unless ``store`` is
    false."""

    id: str
    attempt: int
    store: bool
    content_type: str
    result: bytes | None
    started: datetime | None
    followups: Followups | None = None
    #: The state stored with the result: SUCCESS, or IGNORED for a task that raised Ignore.
    state: str = "SUCCESS"


@dataclass(unsafe_hash=True)
class Failure:
    """A run that ended for good without success: the row is FAILED, DEAD (dead-lettered) or
    CANCELLED, with the error."""

    id: str
    attempt: int
    status: str  # FAILED, DEAD or CANCELLED
    error: str
    traceback: str | None
    store: bool
    content_type: str
    result: bytes | None
    started: datetime | None
    followups: Followups | None = None


@dataclass(unsafe_hash=True)
class RetryAt:
    """A run to be tried again: the row is PENDING again from ``eta`` (or after ``delay``
    seconds), with its retry count."""

    id: str
    attempt: int
    retries: int
    delay: float
    eta: datetime | None
    error: str | None
    traceback: str | None
    outcome: str | None  # attempt-history outcome; None writes no history row
    started: datetime | None
    #: The serialized exception, stored as the RETRY state's info (None stores nothing).
    result: bytes | None = None
    content_type: str = "application/json"


@dataclass(unsafe_hash=True)
class Release:
    """A claim handed back before its task started (a stopping worker, a task name this worker
    does not know): the row is PENDING again after ``delay`` seconds, the attempt given
    back."""

    id: str
    attempt: int
    delay: float
    error: str | None


class Pruned(NamedTuple):
    """What one prune call deleted, the ages it deleted below (database clock), and the newest
    finished time and result date among the rows it deleted (None: it deleted none)."""

    tasks: int
    results: int
    task_cutoff: datetime
    result_cutoff: datetime
    task_last: datetime | None
    result_last: datetime | None


@dataclass(frozen=True)
class ChordSpec:
    """A chord counter to create: its id, the member ids in header order, the body's dict."""

    id: str
    member_ids: Sequence[str]
    body: dict[str, Any]


@dataclass(frozen=True)
class StoredResult:
    """A result decided without running its task (a chord error, a broken chain's later step)."""

    task_id: str
    state: str
    content_type: str
    result: bytes | None
    traceback: str | None = None


@dataclass
class Plan:
    """Rows a canvas operation writes together: chord counters, task rows, results, and the
    chords whose counters must go down (chord id, member id)."""

    messages: list[TaskMessage] = field(default_factory=list)
    chords: list[ChordSpec] = field(default_factory=list)
    results: list[StoredResult] = field(default_factory=list)
    chord_hits: list[tuple[str, str]] = field(default_factory=list)
    #: Where a worker writes what an outcome triggers: by message or chord id, the source of
    #: the row or chord it follows, whose rules it is held to (see insert_followups).
    follows: dict[str, str] = field(default_factory=dict)

    def extend(self, other: Plan, follows: str | None = None) -> None:
        """Add everything ``other`` writes to this plan; with ``follows``, its task rows and
        chords follow a row or chord of that source."""
        self.messages.extend(other.messages)
        self.chords.extend(other.chords)
        self.results.extend(other.results)
        self.chord_hits.extend(other.chord_hits)
        self.follows.update(other.follows)
        if follows is not None:
            for msg in other.messages:
                self.follows.setdefault(msg.id, follows)
            for chord in other.chords:
                self.follows.setdefault(chord.id, follows)

    def __bool__(self) -> bool:
        return bool(self.messages or self.chords or self.results or self.chord_hits)


@dataclass(frozen=True)
class Followups:
    """What a task's completion triggers, decided where it ran: written with the fenced outcome
    and only if that write found the row still owned."""

    on_success: Plan | None = None
    on_failure: Plan | None = None
    chord: str | None = None  # the chord this task is a header member of
