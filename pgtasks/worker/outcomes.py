"""What a claimed row's final state is: the run's outcome (or the reason it did not run) turned
into the Success, Failure or RetryAt the completer writes.

Pure functions of the row, the outcome and the worker's settings: no database, no worker
state, so each decision (FAILED or DEAD, when a lost row is tried again and after how long,
which chord still counts a row that never ran) can be tested alone. What the worker logs about
an outcome is decided here too, as a Note, and emitted by the worker."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from pgtasks.exceptions import NotRegistered
from pgtasks.message import ClaimedTask
from pgtasks.records import Failure, RetryAt, Success
from pgtasks.result import exception_to_dict
from pgtasks.serialization import encode
from pgtasks.states import Status
from pgtasks.worker import execute as ex
from pgtasks.worker.completer import Final
from pgtasks.worker.followups import chord_member

#: The longest wait before a row whose worker was lost runs again, in seconds.
LOST_DELAY_MAX = 60.0

#: Metric outcome of each run kind (LOST rows are counted as retried or dead-lettered).
METRIC_OUTCOMES = {
    ex.SUCCESS: "succeeded",
    ex.FAILURE: "failed",
    ex.RETRY: "retried",
    ex.REJECT_REQUEUE: "rejected",
    ex.IGNORED: "ignored",
    ex.LOST: "retried",
}


@dataclass(frozen=True)
class Note:
    """A log line about an outcome: the level (a method of the worker's task logger), the
    event and its fields."""

    level: str
    event: str
    fields: dict[str, Any] = field(default_factory=dict)

    def emit(self, log: Any) -> None:
        """Write it to ``log`` (a logger with debug/info/warning/error methods)."""
        getattr(log, self.level)(self.event, **self.fields)


def started_at(o: ex.Outcome) -> datetime:
    """When the run began, as the completer stores it."""
    return datetime.fromtimestamp(o.started, tz=timezone.utc)


def succeeded(row: ClaimedTask, o: ex.Outcome) -> Success:
    """The final state of a run that returned."""
    return Success(
        row.id,
        row.attempt,
        o.result is not None,
        o.result.content_type if o.result else "application/json",
        o.result.data if o.result else None,
        started_at(o),
        followups=o.extra.get("followups"),
    )


def lost_delay(lost: int) -> float:
    """Seconds before a row runs again after the ``lost``-th worker running it died: doubling
    from two, up to LOST_DELAY_MAX."""
    return min(2.0**lost, LOST_DELAY_MAX)


def unsuccessful(
    row: ClaimedTask, o: ex.Outcome, *, terminated: bool, max_lost_attempts: int
) -> tuple[Final, Note]:
    """The final state of a run that did not simply succeed, and what to log about it.
    ``terminated``: its process was stopped by revoke(terminate=True), whose write records it
    CANCELLED; ``max_lost_attempts``: how many lost workers dead-letter a row."""
    started = started_at(o)
    result = o.result.data if o.result else None
    content_type = o.result.content_type if o.result else "application/json"
    duration = round(o.runtime, 6)
    if o.kind == ex.IGNORED:
        # Celery stores no outcome for Ignore: the result keeps showing the task as started,
        # never ready. The row still finishes, so nothing runs it again.
        ignored = Success(row.id, row.attempt, True, content_type, None, started, state="IGNORED")
        return ignored, Note("info", "task.ignored", {"duration": duration})
    if o.kind == ex.FAILURE:
        status = Status.DEAD if o.retries_exhausted else Status.FAILED
        if terminated:
            note = Note("info", "task.terminated", {"error": o.error, "duration": duration})
        else:
            note = Note(
                "error",
                "task.dead_lettered" if status == Status.DEAD else "task.failed",
                {
                    "error": o.error,
                    "duration": duration,
                    "args": row.headers.get("argsrepr"),
                    "kwargs": row.headers.get("kwargsrepr"),
                },
            )
        failure = Failure(
            row.id,
            row.attempt,
            status,
            o.error or "failed",
            o.traceback,
            o.result is not None,
            content_type,
            result,
            started,
            followups=o.extra.get("followups"),
        )
        return failure, note
    if o.kind == ex.RETRY:
        when = o.retry_when
        eta = when if isinstance(when, datetime) else None
        delay = 0.0 if isinstance(when, datetime) or when is None else float(when)
        note = Note(
            "warning",
            "task.retry_scheduled",
            {"retry_delay": delay, "eta": str(eta) if eta else None, "error": o.error},
        )
        retry = RetryAt(
            row.id,
            row.attempt,
            row.retries + 1,
            delay,
            eta,
            o.error,
            o.traceback,
            "retry",
            started,
            result=result,
            content_type=content_type,
        )
        return retry, note
    if o.kind == ex.REJECT_REQUEUE:
        note = Note("warning", "task.rejected", {"requeue": True, "error": o.error})
        requeue = RetryAt(
            row.id, row.attempt, row.retries, 0.0, None, o.error, o.traceback, "rejected", started
        )
        return requeue, note
    # LOST: the process running it died
    lost = row.attempt - row.requeued_attempt - row.retries
    if lost >= max_lost_attempts:
        note = Note("error", "task.dead_lettered", {"reason": "worker lost", "error": o.error})
        dead = Failure(
            row.id,
            row.attempt,
            Status.DEAD,
            f"worker lost: {o.error}",
            None,
            False,
            content_type,
            None,
            started,
            followups=chord_member(row.headers),
        )
        return dead, note
    delay = lost_delay(lost)
    note = Note(
        "warning",
        "task.retry_scheduled",
        {"reason": "worker lost", "retry_delay": delay, "error": o.error},
    )
    again = RetryAt(
        row.id,
        row.attempt,
        row.retries,
        delay,
        None,
        f"worker lost: {o.error}",
        None,
        "lost",
        started,
    )
    return again, note


def not_run(row: ClaimedTask, status: str, error: str) -> Failure:
    """A row that ends without running; its chord counts it, where its headers can say which
    (headers that are not a JSON object are dead-lettered as such before they are read)."""
    headers = row.headers if isinstance(row.headers, dict) else {}
    return Failure(
        row.id,
        row.attempt,
        status,
        error,
        None,
        False,
        "application/json",
        None,
        None,
        followups=chord_member(headers),
    )


def unregistered_error(row: ClaimedTask) -> str:
    """Why a row whose task no live worker of its queue has registered is dead-lettered."""
    return (
        f"NotRegistered: no live worker consuming queue {row.queue!r} has registered "
        f"task {row.name!r}; import its module in the worker (include=, imports or "
        f"autodiscover_tasks), then requeue it"
    )


def unregistered(row: ClaimedTask) -> Failure:
    """The dead-lettered row of a task no live worker of its queue has registered: it fails
    with ``NotRegistered`` as in Celery, stored as its result, and its chord counts it."""
    stored = encode(exception_to_dict(NotRegistered(row.name)), "json")
    return Failure(
        row.id,
        row.attempt,
        Status.DEAD,
        unregistered_error(row),
        None,
        True,
        stored.content_type,
        stored.data,
        None,
        followups=chord_member(row.headers),
    )


def metric_outcome(kind: str, final: Final) -> tuple[str, str | None]:
    """A run's outcome as the metrics count it, and, for a dead-lettered row, the reason."""
    if isinstance(final, Failure) and final.status == Status.DEAD:
        return "dead_lettered", "worker lost" if kind == ex.LOST else "retries exhausted"
    return METRIC_OUTCOMES.get(kind, "lost"), None
