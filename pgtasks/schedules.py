"""Periodic schedules, as in :mod:`celery.schedules`: ``crontab`` and ``schedule``.

``from pgtasks.schedules import crontab, schedule`` works as the Celery import does. Every
schedule answers one question for the scheduler, :meth:`BaseSchedule.next_after`: the first
tick strictly after an instant, as an aware UTC datetime. The answer depends only on its
arguments, so any number of scheduler processes compute the same tick instants without
talking to each other. Celery's ``is_due`` and ``remaining_estimate`` are provided on top of it.

Solar schedules (``celery.schedules.solar``) are not supported.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from collections import namedtuple
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta, timezone, tzinfo
from typing import Any, TypeAlias
from zoneinfo import ZoneInfo

__all__ = ["BaseSchedule", "ParseException", "crontab", "maybe_schedule", "schedule"]

Cronspec: TypeAlias = "int | str | Iterable[int]"
schedstate = namedtuple("schedstate", ("is_due", "next"))

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
_WEEKDAYS = ("sunday", "monday", "tuesday", "wednesday", "thursday", "friday", "saturday")
_MONTHS = (
    *("january", "february", "march", "april", "may", "june"),
    *("july", "august", "september", "october", "november", "december"),
)
# The longest length of each month (February of leap years), as Celery checks it.
_DAYS_IN_MONTH = {1: 31, 2: 29, 3: 31, 4: 30, 5: 31, 6: 30}
_DAYS_IN_MONTH |= {7: 31, 8: 31, 9: 30, 10: 31, 11: 30, 12: 31}
# field -> (lowest, highest) value; day_of_week also accepts 7 for Sunday.
_BOUNDS = {
    "minute": (0, 59),
    "hour": (0, 23),
    "day_of_week": (0, 6),
    "day_of_month": (1, 31),
    "month_of_year": (1, 12),
}
_NUMBER = re.compile(r"[0-9]+")


class ParseException(ValueError):
    """A crontab field could not be parsed (a :exc:`ValueError`, unlike Celery's)."""


def _utc(dt: datetime, what: str) -> datetime:
    if dt.tzinfo is None or dt.utcoffset() is None:
        raise ValueError(f"{what} must be an aware datetime, got naive {dt!r}")
    return dt.astimezone(timezone.utc)


def _as_aware(dt: datetime) -> datetime:
    """Celery's convention: a naive datetime is UTC."""
    return dt.replace(tzinfo=timezone.utc) if dt.tzinfo is None else dt


class BaseSchedule:
    """What the scheduler needs of a schedule: :meth:`next_after`, and Celery's API on top."""

    def __init__(self, nowfun: Callable[[], datetime] | None = None, app: Any = None) -> None:
        self.nowfun = nowfun
        self.app = app

    def next_after(
        self, after: datetime, tz: tzinfo = timezone.utc, *, anchor: datetime | None = None
    ) -> datetime:
        """The first tick strictly after the aware ``after``, as an aware UTC datetime."""
        raise NotImplementedError

    def now(self) -> datetime:
        """The current time: ``nowfun()`` if given (naive means UTC), else the UTC clock."""
        return _as_aware(self.nowfun()) if self.nowfun else datetime.now(timezone.utc)

    @property
    def tz(self) -> tzinfo:
        """The timezone of ``is_due``: the app's ``timezone`` setting if any, else UTC."""
        conf = getattr(self.app, "conf", None)
        name = conf.get("timezone") if isinstance(conf, dict) else getattr(conf, "timezone", None)
        if isinstance(name, tzinfo):
            return name
        return ZoneInfo(name) if isinstance(name, str) and name else timezone.utc

    def _next_for(self, last_run_at: datetime) -> datetime:
        return self.next_after(_as_aware(last_run_at), self.tz)

    def remaining_estimate(self, last_run_at: datetime) -> timedelta:
        """Time from now to the next run after ``last_run_at`` (negative if overdue)."""
        return self._next_for(last_run_at) - self.now()

    def _seconds_when_due(self, now: datetime) -> float:
        return (self.next_after(now, self.tz) - now).total_seconds()

    def is_due(self, last_run_at: datetime) -> tuple[bool, float]:
        """Celery's ``(is_due, next_time_to_run)``; the second item is in seconds.

        When due, the seconds are those until the tick after the current one.
        """
        now = self.now()
        remaining = (self._next_for(last_run_at) - now).total_seconds()
        if remaining <= 0:
            return schedstate(True, self._seconds_when_due(now))
        return schedstate(False, remaining)


class schedule(BaseSchedule):
    """Run every ``run_every`` (a :class:`~datetime.timedelta` or seconds), as Celery's.

    Ticks are anchored: ``anchor + k * run_every`` for whole ``k``. :meth:`next_after` takes
    the anchor as a keyword and defaults to the epoch (1970-01-01 UTC), so every process
    agrees on the tick instants. ``is_due``/``remaining_estimate`` keep Celery's meaning,
    ``run_every`` after ``last_run_at`` (anchored at the epoch when ``relative`` is true).
    """

    def __init__(
        self,
        run_every: float | timedelta,
        relative: bool = False,
        nowfun: Callable[[], datetime] | None = None,
        app: Any = None,
    ) -> None:
        if isinstance(run_every, bool) or not isinstance(run_every, (int, float, timedelta)):
            raise TypeError(f"run_every must be a timedelta or seconds, got {run_every!r}")
        if not isinstance(run_every, timedelta):
            run_every = timedelta(seconds=run_every)
        if run_every <= timedelta(0):
            raise ValueError(f"run_every must be positive, got {run_every!r}")
        self.run_every: timedelta = run_every
        self.relative = relative
        super().__init__(nowfun=nowfun, app=app)

    @property
    def seconds(self) -> float:
        """``run_every`` in seconds."""
        return self.run_every.total_seconds()

    def next_after(
        self, after: datetime, tz: tzinfo = timezone.utc, *, anchor: datetime | None = None
    ) -> datetime:
        """``anchor + k * run_every`` for the smallest ``k`` that is strictly after ``after``.

        ``tz`` plays no part: an interval is the same in every timezone. Exact (integer
        microseconds), so processes sharing an anchor compute identical instants.
        """
        start = EPOCH if anchor is None else _utc(anchor, "anchor")
        elapsed = _utc(after, "after") - start
        return start + (elapsed // self.run_every + 1) * self.run_every

    def _next_for(self, last_run_at: datetime) -> datetime:
        last = _as_aware(last_run_at)
        return self.next_after(last, anchor=None if self.relative else last)

    def _seconds_when_due(self, now: datetime) -> float:
        return super()._seconds_when_due(now) if self.relative else self.seconds

    def __repr__(self) -> str:
        return f"<freq: {self.run_every}>"

    def __eq__(self, other: object) -> bool:
        if isinstance(other, schedule):
            return self.run_every == other.run_every
        if isinstance(other, timedelta):
            return self.run_every == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.run_every)


def _value(field: str, spec: str, token: str) -> int:
    low, high = _BOUNDS[field]
    token = token.strip().lower()
    names: tuple[str, ...] = ()
    if field == "day_of_week":
        names, high = _WEEKDAYS, 7
    elif field == "month_of_year":
        names = _MONTHS
    if _NUMBER.fullmatch(token):
        value = int(token)
        if low <= value <= high:
            return value
        raise ParseException(f"crontab {field}={spec!r}: {value} is out of range {low}-{high}")
    if len(token) >= 3:
        for i, name in enumerate(names):
            if name.startswith(token):
                return i + low
    kind = {"day_of_week": "a number or weekday name", "month_of_year": "a number or month name"}
    raise ParseException(
        f"crontab {field}={spec!r}: {token!r} is not {kind.get(field, 'a number')}"
    )


def _parse_part(field: str, spec: str, part: str) -> list[int]:
    low, high = _BOUNDS[field]
    base, slash, step_text = part.partition("/")
    base = base.strip()
    if base == "*":
        values = list(range(low, high + 1))
    else:
        ends = base.split("-")
        if len(ends) > 2:
            raise ParseException(f"crontab {field}={spec!r}: bad range {base!r}")
        first, last = _value(field, spec, ends[0]), _value(field, spec, ends[-1])
        if slash and len(ends) == 1:
            raise ParseException(
                f"crontab {field}={spec!r}: a step needs '*' or a range before it, "
                f"as in '*/{step_text}', not {part.strip()!r}"
            )
        if first <= last:
            values = list(range(first, last + 1))
        else:  # wraps around, as in Celery: 'sat-mon', 'dec-feb', '22-2'
            values = list(range(first, high + 1)) + list(range(low, last + 1))
    if slash:
        if not _NUMBER.fullmatch(step_text.strip()) or int(step_text) == 0:
            raise ParseException(
                f"crontab {field}={spec!r}: step {step_text!r} must be a positive whole number"
            )
        values = values[:: int(step_text)]
    return values


def _expand(field: str, spec: object) -> set[int]:
    """A field's spec (int, str or iterable of ints) as the set of values it matches."""
    low, high = _BOUNDS[field]
    top = 7 if field == "day_of_week" else high
    if isinstance(spec, str):
        parts = spec.split(",")
        if any(not part.strip() for part in parts):
            raise ParseException(f"crontab {field}={spec!r}: empty part")
        values = [v for part in parts for v in _parse_part(field, spec, part)]
    elif isinstance(spec, int) and not isinstance(spec, bool):
        values = [spec]
    elif isinstance(spec, Iterable):
        values = list(spec)
        if not values:
            raise ValueError(f"crontab {field}={spec!r}: no values")
    else:
        raise TypeError(f"crontab {field}: expected an int, str or iterable, got {spec!r}")
    for value in values:
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"crontab {field}={spec!r}: {value!r} is not an int")
        if not low <= value <= top:
            raise ValueError(f"crontab {field}={spec!r}: {value} is out of range {low}-{top}")
    return {0 if field == "day_of_week" and v == 7 else v for v in values}


def _to_instant(wall: datetime, tz: tzinfo) -> datetime:
    """The UTC instant of a naive wall time in ``tz``, by the rules in :class:`crontab`."""
    first = wall.replace(tzinfo=tz, fold=0).astimezone(timezone.utc)
    if first.astimezone(tz).replace(tzinfo=None) == wall:
        return first  # exists; if ambiguous, fold=0 is its first occurrence
    # In a gap: fold=1 reads it with the offset after the transition, landing before the
    # gap; fold=0 with the one before, landing after it. Find the transition between them.
    lo, hi = wall.replace(tzinfo=tz, fold=1).astimezone(timezone.utc), first
    offset_after = hi.astimezone(tz).utcoffset()
    while hi - lo > timedelta(seconds=1):  # transitions fall on whole seconds
        mid = lo + (hi - lo) // 2
        if mid.astimezone(tz).utcoffset() == offset_after:
            hi = mid
        else:
            lo = mid
    return hi.replace(microsecond=0)  # lo < transition <= hi < lo + 1s


class crontab(BaseSchedule):
    """Cron-like schedule with Celery's fields, syntax and matching.

    Each field takes an int, an iterable of ints, or a string of comma-separated parts: ``*``,
    a number, a range ``1-5`` (ranges wrap: ``sat-mon``), each optionally with a step
    (``*/15``, ``1-30/5``). ``day_of_week`` runs 0-6 from Sunday and also takes 7 for Sunday
    and weekday names (``mon-fri``, ``sun``, ``sunday``); ``month_of_year`` takes month names
    (``jan``). A time matches when every field matches: as in Celery, ``day_of_week`` and
    ``day_of_month`` must both match (not either, as in Vixie cron). Bad input raises
    :exc:`ValueError` naming the field and value (:exc:`TypeError` for a wrong type).

    The fields are read as wall-clock time in the ``tz`` given to :meth:`next_after`, as
    Celery reads them in the app's timezone; ticks fall on whole minutes. Around
    daylight-saving transitions, where Celery's results are accidental:

    * a wall time that does not exist (skipped by a spring-forward gap) fires at the first
      instant after the gap (02:30 on the day Berlin skips 02:00-03:00 fires at 03:00 CEST,
      once, together with any tick of 03:00 itself; Celery would fire at 03:30);
    * a wall time that occurs twice (fall back) fires once, at its first occurrence. Celery
      agrees unless its last run fell in the repeated hour's second pass: then it answers
      with the first occurrence, already past, and stays due for the rest of that hour.
    """

    def __init__(
        self,
        minute: Cronspec = "*",
        hour: Cronspec = "*",
        day_of_week: Cronspec = "*",
        day_of_month: Cronspec = "*",
        month_of_year: Cronspec = "*",
        nowfun: Callable[[], datetime] | None = None,
        app: Any = None,
    ) -> None:
        self._orig = (minute, hour, day_of_month, month_of_year, day_of_week)
        self.minute = _expand("minute", minute)
        self.hour = _expand("hour", hour)
        self.day_of_week = _expand("day_of_week", day_of_week)
        self.day_of_month = _expand("day_of_month", day_of_month)
        self.month_of_year = _expand("month_of_year", month_of_year)
        if not any(d <= _DAYS_IN_MONTH[m] for m in self.month_of_year for d in self.day_of_month):
            raise ValueError(
                f"crontab: day_of_month {day_of_month!r} never occurs in "
                f"month_of_year {month_of_year!r}"
            )
        super().__init__(nowfun=nowfun, app=app)

    @classmethod
    def from_string(cls, expression: str) -> crontab:
        """A crontab from a five-field cron line: ``'minute hour dom month dow'``."""
        fields = expression.split()
        if len(fields) != 5:
            raise ValueError(f"crontab expression {expression!r} needs 5 fields")
        minute, hour, day_of_month, month_of_year, day_of_week = fields
        return cls(minute, hour, day_of_week, day_of_month, month_of_year)

    def _next_wall(self, wall: datetime) -> datetime:
        """The first matching naive wall time (a whole minute) strictly after ``wall``."""
        t = wall.replace(second=0, microsecond=0, fold=0) + timedelta(minutes=1)
        hours, minutes = sorted(self.hour), sorted(self.minute)
        limit = t.year + 400
        while t.year < limit:
            if t.month not in self.month_of_year:
                year, month = divmod(t.year * 12 + t.month, 12)  # the month after t
                t = datetime(year, month + 1, 1)
            elif t.day not in self.day_of_month or t.isoweekday() % 7 not in self.day_of_week:
                t = datetime(t.year, t.month, t.day) + timedelta(days=1)
            elif t.hour not in self.hour:
                i = bisect_right(hours, t.hour)
                if i == len(hours):
                    t = datetime(t.year, t.month, t.day) + timedelta(days=1)
                else:
                    t = t.replace(hour=hours[i], minute=0)
            elif t.minute not in self.minute:
                i = bisect_right(minutes, t.minute)
                if i == len(minutes):
                    t = t.replace(minute=0) + timedelta(hours=1)
                else:
                    t = t.replace(minute=minutes[i])
            else:
                return t
        raise RuntimeError(f"{self!r} has no tick within 400 years of {wall}")

    def next_after(
        self, after: datetime, tz: tzinfo = timezone.utc, *, anchor: datetime | None = None
    ) -> datetime:
        """The first tick strictly after ``after``, the fields read in ``tz``; ``anchor`` is unused.

        Wall times map to instants monotonically (see the class docstring), so walking the
        matching wall times forward finds the first instant after ``after``.
        """
        utc_after = _utc(after, "after")
        wall = utc_after.astimezone(tz).replace(tzinfo=None, fold=0)
        for _ in range(10_000):  # more than the minutes of any repeated wall-clock period
            wall = self._next_wall(wall)
            instant = _to_instant(wall, tz)
            if instant > utc_after:
                return instant
        raise RuntimeError(f"{self!r} found no tick after {after}")

    def __repr__(self) -> str:
        return "<crontab: {} {} {} {} {} (m/h/dM/MY/d)>".format(*self._orig)

    def _key(self) -> tuple[frozenset[int], ...]:
        fields = (self.minute, self.hour, self.day_of_week, self.day_of_month)
        return tuple(frozenset(f) for f in (*fields, self.month_of_year))

    def __eq__(self, other: object) -> bool:
        if isinstance(other, crontab):
            return self._key() == other._key()
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._key())


def maybe_schedule(
    value: float | timedelta | BaseSchedule, relative: bool = False, app: Any = None
) -> BaseSchedule:
    """A schedule from seconds, a :class:`~datetime.timedelta`, or a schedule (returned as is)."""
    if isinstance(value, BaseSchedule):
        if app is not None:
            value.app = app
        return value
    return schedule(value, relative, app=app)
