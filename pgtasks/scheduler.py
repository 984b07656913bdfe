"""Periodic tasks: Celery's ``beat_schedule``, enqueued once per tick by any number of schedulers.

Every scheduler (a worker started with ``-B``, or ``pgtasks beat``) reads the same schedule from
the app and computes the same tick instants (``pgtasks.schedules``). For each due tick it writes
the ``(entry, tick time)`` row and the task in one statement; the row's primary key lets exactly
one scheduler win, and a scheduler that dies mid-tick leaves both rows or neither. Each entry's
last enqueued tick lives in ``schedule_entries``, so a restarted scheduler goes on where the
others left off.

Missed ticks (every scheduler was down) follow the entry's policy:

- ``"once"`` (default): the latest missed tick is enqueued, once, on recovery.
- ``"skip"``: ticks more than ``beat_grace`` seconds late are dropped; the next one runs.
- ``"all"``: every missed tick is enqueued (catch-up), oldest first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone, tzinfo
from typing import TYPE_CHECKING, Any

import structlog

from pgtasks import signals
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.schedules import BaseSchedule, maybe_schedule
from pgtasks.utils import uuid as new_id

if TYPE_CHECKING:
    from pgtasks.app import Celery

log = structlog.get_logger("pgtasks")

MISSED_POLICIES = ("once", "skip", "all")
#: Ticks enqueued for one entry in one pass when catching up (the rest follow next pass).
CATCH_UP_BATCH = 100
_ENTRY_KEYS = {"task", "schedule", "args", "kwargs", "options", "relative", "missed"}


@dataclass(frozen=True)
class Entry:
    """One ``beat_schedule`` entry: a task called with the same arguments at every tick."""

    name: str
    task: str
    schedule: BaseSchedule
    args: tuple[Any, ...] = ()
    kwargs: dict[str, Any] = field(default_factory=dict)
    options: dict[str, Any] = field(default_factory=dict)
    missed: str = "once"


def load_entries(app: Celery) -> list[Entry]:
    """The app's ``beat_schedule`` (with ``add_periodic_task`` entries), checked."""
    app.finalize()
    raw = app.conf.get("beat_schedule") or {}
    if not isinstance(raw, Mapping):
        raise ImproperlyConfigured("beat_schedule must be a dict of entry name -> entry dict")
    default_missed = app.settings.beat_missed_ticks
    return [_entry(str(name), spec, default_missed) for name, spec in raw.items()]


def _entry(name: str, spec: Any, default_missed: str) -> Entry:
    where = f"beat_schedule entry {name!r}"
    if not isinstance(spec, Mapping):
        raise ImproperlyConfigured(f"{where} must be a dict with 'task' and 'schedule'")
    unknown = set(spec) - _ENTRY_KEYS
    if unknown:
        raise ImproperlyConfigured(
            f"{where}: unknown key(s) {', '.join(sorted(unknown))} "
            f"(known: {', '.join(sorted(_ENTRY_KEYS))})"
        )
    task = spec.get("task")
    if not isinstance(task, str) or not task:
        raise ImproperlyConfigured(f"{where} needs 'task': the task's registered name")
    if "schedule" not in spec:
        raise ImproperlyConfigured(f"{where} needs 'schedule': a crontab, timedelta or seconds")
    try:
        schedule = maybe_schedule(spec["schedule"])
    except (TypeError, ValueError) as exc:
        raise ImproperlyConfigured(f"{where}: {exc}") from None
    args, kwargs, options = spec.get("args") or (), spec.get("kwargs") or {}, spec.get("options")
    if not isinstance(args, (list, tuple)):
        raise ImproperlyConfigured(f"{where}: 'args' must be a list or tuple")
    if not isinstance(kwargs, Mapping):
        raise ImproperlyConfigured(f"{where}: 'kwargs' must be a dict")
    if options is not None and not isinstance(options, Mapping):
        raise ImproperlyConfigured(f"{where}: 'options' must be a dict of apply_async options")
    missed = spec.get("missed", default_missed)
    if missed not in MISSED_POLICIES:
        raise ImproperlyConfigured(
            f"{where}: 'missed' must be one of {', '.join(MISSED_POLICIES)}, not {missed!r}"
        )
    return Entry(name, task, schedule, tuple(args), dict(kwargs), dict(options or {}), missed)


def due_ticks(
    schedule: BaseSchedule,
    tz: tzinfo,
    after: datetime,
    now: datetime,
    policy: str = "once",
    grace: float = 60.0,
    limit: int = CATCH_UP_BATCH,
) -> list[datetime]:
    """The ticks to enqueue now: those in ``(after, now]`` chosen by the missed-tick policy."""
    if policy == "skip":
        # A tick exactly ``grace`` seconds late still runs.
        after = max(after, now - timedelta(seconds=grace, microseconds=1))
    if policy == "all":
        return _ticks_between(schedule, tz, after, now, limit)
    # Only the latest tick counts: look for it in growing windows before now, so a long
    # outage does not walk every tick it missed.
    for window in _LATEST_WINDOWS:
        start = after if window is None else max(after, now - window)
        latest = _ticks_between(schedule, tz, start, now, None)[-1:]
        if latest or start == after:
            return latest
    return []


_LATEST_WINDOWS = (timedelta(hours=1), timedelta(days=2), timedelta(days=40), None)


def _ticks_between(
    schedule: BaseSchedule, tz: tzinfo, after: datetime, now: datetime, limit: int | None
) -> list[datetime]:
    """Ticks in ``(after, now]``, oldest first; with no ``limit``, only the last is kept."""
    found: list[datetime] = []
    tick = schedule.next_after(after, tz)
    while tick <= now:
        found.append(tick)
        if limit is not None and len(found) >= limit:
            break
        if limit is None and len(found) > 1:
            found.pop(0)
        tick = schedule.next_after(tick, tz)
    return found


class Scheduler:
    """Enqueues the app's periodic tasks at their ticks; safe to run in many processes at once.

    ``now`` replaces the database clock as the scheduler's notion of the current time (tests
    move it forward instead of waiting).
    """

    def __init__(
        self,
        app: Celery,
        *,
        now: Callable[[], datetime] | None = None,
        max_interval: float | None = None,
        grace: float | None = None,
    ) -> None:
        self.app = app
        self._now = now
        settings = app.settings
        self.max_interval = max_interval if max_interval is not None else settings.beat_max_interval
        self.grace = grace if grace is not None else settings.beat_grace
        self.entries: list[Entry] = []
        self._synced = False

    @property
    def tz(self) -> tzinfo:
        return self.app.timezone

    def sync(self) -> list[Entry]:
        """Load the schedule from the app and record its entries (new ones start from now)."""
        self.entries = load_entries(self.app)
        now = self._now() if self._now is not None else None
        self.app.broker.sync_schedule(
            [(e.name, e.task, repr(e.schedule)) for e in self.entries], now
        )
        self._synced = True
        return self.entries

    def tick(self) -> float:
        """One pass: enqueue every due tick; returns the seconds until the next one is due."""
        if not self._synced:
            self.sync()
        if not self.entries:
            return self.max_interval
        db_now, state = self.app.broker.schedule_state([e.name for e in self.entries])
        now = self._now() if self._now is not None else db_now
        if any(e.name not in state for e in self.entries):
            # An entry row went missing (removed by hand): record it again, starting from now.
            self.sync()
            db_now, state = self.app.broker.schedule_state([e.name for e in self.entries])
        wait = self.max_interval
        for entry in self.entries:
            last, created = state.get(entry.name, (None, now))
            after = last or created
            try:
                for when in due_ticks(
                    entry.schedule, self.tz, after, now, entry.missed, self.grace
                ):
                    self._enqueue(entry, when)
                    after = when
            except Exception as exc:
                # One entry that cannot be enqueued must not hold up the others.
                log.warning("beat.error", entry=entry.name, error=str(exc).strip())
                continue
            upcoming = entry.schedule.next_after(max(after, now), self.tz)
            wait = min(wait, (upcoming - now).total_seconds())
        return max(wait, 0.0)

    def _enqueue(self, entry: Entry, when: datetime) -> bool:
        task = self.app.tasks.get(entry.task) or self.app.task_stub(entry.task)
        try:
            msg = task.build_message(entry.args, entry.kwargs, task_id=new_id(), **entry.options)
        except Exception as exc:
            log.error("beat.entry_invalid", entry=entry.name, task_name=entry.task, error=str(exc))
            return False
        following = entry.schedule.next_after(when, self.tz)
        signals.send_before_publish(msg, entry.args, entry.kwargs)
        enqueued = self.app.broker.enqueue_tick(msg, entry.name, when, following)
        if enqueued:
            signals.send_after_publish(msg, entry.args, entry.kwargs)
            log.info(
                "beat.tick",
                entry=entry.name,
                task_name=entry.task,
                task_id=msg.id,
                tick=when.isoformat(),
                next_tick=following.isoformat(),
            )
        else:
            log.debug("beat.tick_taken", entry=entry.name, tick=when.isoformat())
        return enqueued

    def run(self, stopped: threading.Event) -> None:
        """Tick until ``stopped`` is set; database errors are logged and retried."""
        signals.beat_init.send(sender=self)
        backoff = 1.0
        while not stopped.is_set():
            try:
                wait = self.tick()
                backoff = 1.0
            except ImproperlyConfigured:
                raise
            except Exception as exc:
                log.warning("beat.error", error=str(exc).strip(), retry_in=backoff)
                wait, backoff = backoff, min(backoff * 2, 30.0)
            stopped.wait(min(wait, self.max_interval))

    def listing(self) -> list[dict[str, Any]]:
        """Each entry with its last and next tick, for ``pgtasks beat --list``."""
        entries = load_entries(self.app)
        known = {row["name"]: row for row in self.app.broker.schedule_entries()}
        now = datetime.now(timezone.utc)
        out = []
        for e in entries:
            row = known.get(e.name, {})
            last = row.get("last_tick")
            after = max(last, now) if last is not None else now
            out.append(
                {
                    "name": e.name,
                    "task": e.task,
                    "schedule": repr(e.schedule),
                    "last_tick": last,
                    "next_tick": e.schedule.next_after(after, self.tz),
                    "missed": e.missed,
                    "args": list(e.args),
                    "kwargs": e.kwargs,
                    "options": e.options,
                }
            )
        return out


class BeatService(threading.Thread):
    """A worker's scheduler (``-B``): runs ``Scheduler.run`` beside the claim loop."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(name="pgtasks-beat", daemon=True)
        self.scheduler = scheduler
        self.stopped = threading.Event()

    def run(self) -> None:
        try:
            self.scheduler.run(self.stopped)
        except Exception:
            log.exception("beat.stopped", reason="the schedule cannot be used")

    def stop(self) -> None:
        self.stopped.set()


def add_periodic_task(
    app: Celery,
    schedule: Any,
    sig: Any,
    args: Iterable[Any] = (),
    kwargs: Mapping[str, Any] | None = None,
    name: str | None = None,
    **options: Any,
) -> str:
    """Celery's ``app.add_periodic_task``: add an entry to ``beat_schedule``; returns its name."""
    from pgtasks.canvas import Signature

    if isinstance(sig, Signature):
        task, args, kwargs = (
            sig.task,
            tuple(sig.args) + tuple(args),
            {**sig.kwargs, **(kwargs or {})},
        )
        options = {**dict(sig.options), **options}
    elif isinstance(sig, str):
        task = sig
    else:
        raise TypeError("add_periodic_task needs a signature (task.s(...)) or a task name")
    key = name or f"{task}({', '.join(map(repr, args))})"
    schedule_dict = dict(app.conf.get("beat_schedule") or {})
    schedule_dict[key] = {
        "task": task,
        "schedule": schedule,
        "args": tuple(args),
        "kwargs": dict(kwargs or {}),
        "options": options,
    }
    app.conf["beat_schedule"] = schedule_dict
    return key
