"""What each dashboard page shows, as plain dicts: the HTML pages and the JSON API read the same
functions, and every one of them reads the database through :mod:`pgtasks.broker`."""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from datetime import date, datetime, timedelta, timezone
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from pgtasks import states
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.serialization import Unreadable

if TYPE_CHECKING:
    from pgtasks.app import Celery

Row = dict[str, Any]

#: Row statuses, in the order a task moves through them.
STATUSES = ("PENDING", "BLOCKED", "RUNNING", "COMPLETED", "FAILED", "CANCELLED", "DEAD")
#: Minutes shown by the throughput chart.
CHART_MINUTES = 60
#: Seconds over which the queues page counts finished rows and throughput.
QUEUE_WINDOW = 300.0
#: The largest page a list accepts.
MAX_LIMIT = 500

_RELATIVE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd])\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}


class BadRequest(ValueError):
    """A request parameter the dashboard cannot use (answered with 400 and this message)."""


# -- JSON ---------------------------------------------------------------------------------------


def jsonable(value: Any) -> Any:
    """``value`` with every datetime, bytes and other non-JSON value turned into JSON's types."""
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, Decimal):
        return float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value).hex()
    if isinstance(value, dict):
        return {str(k): jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [jsonable(v) for v in value]
    if isinstance(value, BaseException):
        return {"type": type(value).__name__, "message": str(value)}
    return repr(value)


def dumps(value: Any) -> str:
    return json.dumps(jsonable(value), separators=(",", ":"))


# -- request parameters ---------------------------------------------------------------------------


def parse_time(value: str | None, what: str) -> datetime | None:
    """An ISO 8601 time (naive means UTC) or an age back from now (``15m``, ``2h``, ``1d``)."""
    if value is None or not value.strip():
        return None
    relative = _RELATIVE.match(value)
    if relative:
        seconds = float(relative.group(1)) * _UNITS[relative.group(2)]
        return datetime.now(timezone.utc) - timedelta(seconds=seconds)
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        raise BadRequest(
            f"{what}: expected an ISO 8601 time (2024-05-01T12:00) or an age (15m, 2h, 1d)"
        ) from None
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=timezone.utc)


def parse_int(value: str | None, what: str, default: int, low: int, high: int) -> int:
    if value is None or not value.strip():
        return default
    try:
        number = int(value)
    except ValueError:
        raise BadRequest(f"{what}: expected a whole number") from None
    if not low <= number <= high:
        raise BadRequest(f"{what}: expected a number from {low} to {high}")
    return number


def _text(value: str | None) -> str | None:
    return value.strip() or None if value is not None else None


@dataclass(frozen=True)
class TaskFilters:
    """The tasks page's filters, as given in its query string."""

    state: str | None = None
    queue: str | None = None
    name: str | None = None
    since: str | None = None
    until: str | None = None
    page: int = 1
    limit: int = 50

    @classmethod
    def parse(cls, params: Any) -> TaskFilters:
        state = _text(params.get("state"))
        if state is not None:
            state = state.upper()
            if state not in STATUSES:
                raise BadRequest(f"state: expected one of {', '.join(STATUSES)}")
        found = cls(
            state=state,
            queue=_text(params.get("queue")),
            name=_text(params.get("name")),
            since=_text(params.get("since")),
            until=_text(params.get("until")),
            page=parse_int(params.get("page"), "page", 1, 1, 1_000_000),
            limit=parse_int(params.get("limit"), "limit", 50, 1, MAX_LIMIT),
        )
        parse_time(found.since, "since")
        parse_time(found.until, "until")
        return found

    def query(self, **changes: Any) -> dict[str, str]:
        """The query string of these filters (with ``changes``), empty values left out."""
        values = {
            "state": self.state,
            "queue": self.queue,
            "name": self.name,
            "since": self.since,
            "until": self.until,
            "page": self.page,
            "limit": self.limit,
        }
        values.update(changes)
        if values["page"] == 1:
            values["page"] = None
        if values["limit"] == 50:
            values["limit"] = None
        return {k: str(v) for k, v in values.items() if v is not None}


# -- pages ----------------------------------------------------------------------------------------


def _bucket(outcome: str) -> str:
    if outcome == "completed":
        return "completed"
    if outcome in ("failed", "dead"):
        return "failed"
    return "other"


def overview(app: Celery) -> Row:
    """Live workers, attempts finished per minute over the last hour, totals by status and the
    latest failures."""
    found = app.broker.overview(CHART_MINUTES * 60.0, app.settings.lease_seconds)
    end = datetime.now(timezone.utc).replace(second=0, microsecond=0)
    start = end - timedelta(minutes=CHART_MINUTES - 1)
    minutes = {
        start + timedelta(minutes=i): {"completed": 0, "failed": 0, "other": 0}
        for i in range(CHART_MINUTES)
    }
    for row in found["minutes"]:
        minute = row["minute"].astimezone(timezone.utc)
        # A database clock slightly ahead of this one: count it in the last minute shown.
        counts = minutes.get(min(max(minute, start), end))
        if counts is not None:
            counts[_bucket(row["outcome"])] += int(row["n"])
    series = [
        {"minute": minute, **counts, "total": sum(counts.values())}
        for minute, counts in minutes.items()
    ]
    workers = [
        {
            "id": w["id"],
            "host": w["host"],
            "pid": w["pid"],
            "queues": list(w["queues"] or ()),
            "concurrency": w["concurrency"],
            "tasks": len(w["tasks"] or ()),
            "started_at": w["started_at"],
            "heartbeat_at": w["heartbeat_at"],
            "uptime": w["uptime"],
        }
        for w in found["workers"]
    ]
    return {
        "totals": found["totals"],
        "workers": workers,
        "throughput": series,
        "finished_last_hour": sum(p["total"] for p in series),
        "failed_last_hour": sum(p["failed"] for p in series),
        "recent_failures": app.broker.task_list(state="FAILED", limit=10),
    }


def queues(app: Celery) -> Row:
    """Each queue's waiting, running and dead rows and its throughput."""
    return {"window_seconds": QUEUE_WINDOW, "queues": app.broker.queue_stats(QUEUE_WINDOW)}


def tasks(app: Celery, filters: TaskFilters) -> Row:
    """One page of task rows, most recently changed first."""
    rows = app.broker.task_list(
        state=filters.state,
        queue=filters.queue,
        name=filters.name,
        since=parse_time(filters.since, "since"),
        until=parse_time(filters.until, "until"),
        limit=filters.limit + 1,
        offset=(filters.page - 1) * filters.limit,
    )
    return {
        "tasks": rows[: filters.limit],
        "page": filters.page,
        "limit": filters.limit,
        "has_next": len(rows) > filters.limit,
        "filters": {
            "state": filters.state,
            "queue": filters.queue,
            "name": filters.name,
            "since": filters.since,
            "until": filters.until,
        },
    }


def task_detail(app: Celery, task_id: str) -> Row | None:
    """One task: its row and headers, the call's argsrepr/kwargsrepr (never the payload), its
    result's state and its attempt history; None when the row is gone."""
    row = app.broker.task_detail(task_id)
    if row is None:
        return None
    headers = row.get("headers")
    detail = {k: v for k, v in row.items() if k not in ("payload", "payload_raw_bytes")}
    if isinstance(headers, Unreadable):
        # A row dead-lettered for headers nobody can read: shown, with why, not a failed page.
        detail["headers"] = {"unreadable": headers.error}
        headers = {}
    elif not isinstance(headers, dict):
        headers = {}
    detail["argsrepr"] = headers.get("argsrepr")
    detail["kwargsrepr"] = headers.get("kwargsrepr")
    detail["state"] = app.AsyncResult(task_id).state
    return detail


def task_status(app: Celery, task_id: str) -> Row:
    """Celery's view of one task (AsyncResult): state, result or error, traceback, when done."""
    result = app.AsyncResult(task_id)
    state = result.state
    try:
        value: Any = result.result
    except Exception as exc:  # a result this process cannot decode
        value = {"undecodable": f"{type(exc).__name__}: {exc}"}
    try:
        json.dumps(jsonable(value))
        shown = jsonable(value)
    except (TypeError, ValueError):
        shown = repr(value)
    return {
        "id": task_id,
        "state": state,
        "ready": state in states.READY_STATES,
        "successful": state == states.SUCCESS,
        "result": shown,
        "traceback": result.traceback if state in states.EXCEPTION_STATES else None,
        "date_done": result.date_done,
    }


def dead_letters(
    app: Celery, task_name: str | None, queue: str | None, page: int, limit: int
) -> Row:
    """One page of dead letters, most recently dead-lettered first."""
    rows = app.broker.dead_letters(limit + 1, (page - 1) * limit, task_name=task_name, queue=queue)
    return {
        "dead_letters": rows[:limit],
        "page": page,
        "limit": limit,
        "has_next": len(rows) > limit,
        "filters": {"task": task_name, "queue": queue},
    }


def schedules(app: Celery) -> Row:
    """The app's periodic entries with their last and next tick, and entries the database
    recorded that this app's schedule no longer has."""
    from pgtasks.scheduler import Scheduler

    error = None
    try:
        entries = Scheduler(app).listing()
    except ImproperlyConfigured as exc:
        entries, error = [], str(exc)
    for entry in entries:
        entry["args"] = repr(tuple(entry["args"]))
        entry["kwargs"] = repr(entry["kwargs"])
        entry["options"] = repr(entry["options"])
    names = {e["name"] for e in entries}
    recorded = [r for r in app.broker.schedule_entries() if r["name"] not in names]
    return {"entries": entries, "not_in_app": recorded, "error": error}


# -- changes ------------------------------------------------------------------------------------

_ENQUEUE_KEYS = {"task", "args", "kwargs", "countdown", "eta", "queue", "priority"}


def enqueue(app: Celery, body: Any) -> str:
    """Send the task a JSON body names (``task``, ``args``, ``kwargs``, ``countdown``, ``eta``,
    ``queue``, ``priority``); returns its id."""
    if not isinstance(body, dict):
        raise BadRequest('expected a JSON object: {"task": NAME, "args": [...], "kwargs": {...}}')
    unknown = sorted(set(body) - _ENQUEUE_KEYS)
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    name = body.get("task")
    if not isinstance(name, str) or not name.strip():
        raise BadRequest('"task": expected the task name')
    args = body.get("args", [])
    if not isinstance(args, list):
        raise BadRequest('"args": expected a list')
    kwargs = body.get("kwargs", {})
    if not isinstance(kwargs, dict):
        raise BadRequest('"kwargs": expected an object')
    options: dict[str, Any] = {}
    countdown = body.get("countdown")
    if countdown is not None:
        if isinstance(countdown, bool) or not isinstance(countdown, int | float):
            raise BadRequest('"countdown": expected seconds')
        if not math.isfinite(countdown) or countdown < 0:
            raise BadRequest('"countdown": expected seconds, 0 or more')
        options["countdown"] = countdown
    eta = body.get("eta")
    if eta is not None:
        if not isinstance(eta, str):
            raise BadRequest('"eta": expected an ISO 8601 time')
        try:
            when = datetime.fromisoformat(eta.replace("Z", "+00:00"))
        except ValueError:
            raise BadRequest('"eta": expected an ISO 8601 time') from None
        options["eta"] = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    queue = body.get("queue")
    if queue is not None:
        if not isinstance(queue, str) or not queue.strip():
            raise BadRequest('"queue": expected a queue name')
        options["queue"] = queue
    priority = body.get("priority")
    if priority is not None:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise BadRequest('"priority": expected a whole number')
        options["priority"] = priority
    result = app.send_task(name, args, kwargs, **options)
    return str(result.id)


@dataclass(frozen=True)
class Selection:
    """The dead letters a requeue or discard of the JSON API names: the given ``ids`` (``task``
    narrows them), or with ``ids`` None every one matching ``filter``, refused when more than
    ``expect`` match (the count the caller saw)."""

    ids: list[str] | None
    filter: DeadFilter
    expect: int | None = None


def selection(body: Any) -> Selection:
    """The dead letters a requeue or discard names: ``{"ids": [...]}``, or ``{"all": true}``
    narrowed by ``"task"`` and ``"queue"``, with ``"expect": N`` to refuse when more than N
    match (``"task"`` narrows ``"ids"`` too)."""
    if not isinstance(body, dict):
        raise BadRequest('expected a JSON object: {"ids": [...]} or {"all": true}')
    unknown = sorted(set(body) - {"ids", "all", "task", "queue", "expect"})
    if unknown:
        raise BadRequest(f"unknown field(s): {', '.join(unknown)}")
    ids = body.get("ids")
    everything = body.get("all", False)
    task_name = body.get("task")
    queue = body.get("queue")
    expect = body.get("expect")
    if not isinstance(everything, bool):
        raise BadRequest('"all": expected true or false')
    if task_name is not None and (not isinstance(task_name, str) or not task_name.strip()):
        raise BadRequest('"task": expected a task name')
    if queue is not None and (not isinstance(queue, str) or not queue.strip()):
        raise BadRequest('"queue": expected a queue name')
    if expect is not None and (
        isinstance(expect, bool) or not isinstance(expect, int) or expect < 0
    ):
        raise BadRequest('"expect": expected the number of dead letters you saw (0 or more)')
    found = DeadFilter.parse(task_name, queue)
    if ids is not None:
        if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
            raise BadRequest('"ids": expected a list of task ids')
        if everything:
            raise BadRequest('give "ids" or "all", not both')
        if queue is not None or expect is not None:
            raise BadRequest('"queue" and "expect" go with "all"; "ids" are exact')
        return Selection(list(dict.fromkeys(ids)), found)
    if not everything:
        raise BadRequest('give "ids": [...] or "all": true')
    return Selection(None, found, expect)


# -- the set a bulk action names ------------------------------------------------------------------

#: Rows read per statement when every dead letter a bulk action names is listed.
SNAPSHOT_PAGE = 10_000
#: The most dead letters one bulk action of the dashboard changes (the command line has no
#: such bound).
BULK_MAX = 100_000
#: Rows shown on a bulk action's confirmation page.
CONFIRM_SAMPLE = 50


@dataclass(frozen=True)
class DeadFilter:
    """Which dead letters a page or a bulk action means: those of a task name and/or queue."""

    task: str | None = None
    queue: str | None = None

    @classmethod
    def parse(cls, task: str | None, queue: str | None) -> DeadFilter:
        return cls(_text(task), _text(queue))

    def describe(self) -> str:
        """``" of task proj.add in queue io"``, or ``""`` without a filter."""
        task = f" of task {self.task}" if self.task else ""
        queue = f" in queue {self.queue}" if self.queue else ""
        return task + queue

    def query(self) -> dict[str, str]:
        return {k: v for k, v in (("task", self.task), ("queue", self.queue)) if v}


def dead_letters_phrase(count: int, found: DeadFilter | None = None) -> str:
    """``"11 dead letters of task proj.add"``, ``"1 dead letter"``."""
    noun = "dead letter" if count == 1 else "dead letters"
    return f"{count:,} {noun}{found.describe() if found else ''}"


@dataclass(frozen=True)
class DeadSet:
    """The dead letters a bulk action names, read at one moment: their ``ids``, ``until`` (the
    newest one's time: a row dead-lettered later is not part of the set) and the first
    :data:`CONFIRM_SAMPLE` rows, to show."""

    ids: list[str]
    until: datetime | None
    sample: list[Row]


class TooMany(BadRequest):
    """More dead letters than one bulk action of the dashboard changes."""


def dead_set(
    app: Celery, found: DeadFilter, until: datetime | None = None, at_most: int = BULK_MAX
) -> DeadSet:
    """Every dead letter matching ``found``, dead-lettered at or before ``until`` (when not
    given: the newest one's time as the first page is read). Read a page at a time, newest
    first; rows dead-lettered meanwhile are newer than ``until`` and left out, and a row seen
    twice (the pages shifted under them) is counted once."""
    ids: dict[str, None] = {}
    sample: list[Row] = []
    offset = 0
    while True:
        rows = app.broker.dead_letters(
            SNAPSHOT_PAGE, offset, task_name=found.task, queue=found.queue
        )
        for row in rows:
            if until is None:
                until = row["updated_at"]
            if row["updated_at"] > until or row["id"] in ids:
                continue  # newer than the set, or seen again on this page after a shift
            ids[row["id"]] = None
            if len(sample) < CONFIRM_SAMPLE:
                sample.append(row)
        if len(ids) > at_most:
            raise TooMany(
                f"more than {at_most:,} dead letters{found.describe()} match; the dashboard "
                "changes at most that many at once: narrow the filter, or use "
                "`pgtasks dlq requeue --all` or `pgtasks dlq discard --all`"
            )
        if len(rows) < SNAPSHOT_PAGE:
            return DeadSet(list(ids), until, sample)
        offset += SNAPSHOT_PAGE
