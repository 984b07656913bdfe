"""pgtasks.schedules: Celery's crontab and interval schedules, and ``next_after`` for the scheduler.

The crontab's next tick is checked against Celery's own ``crontab`` on random expressions and
instants, in UTC and in zones with daylight saving time; where Celery's answer around a DST
transition is accidental, our documented choice is checked instead.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta, timezone
from typing import Any
from zoneinfo import ZoneInfo

import celery
import celery.schedules
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks import Celery
from pgtasks.schedules import ParseException, crontab, maybe_schedule, schedule

UTC = timezone.utc
BERLIN = ZoneInfo("Europe/Berlin")
ZONES = ("UTC", "Europe/Berlin", "America/New_York")


def utc(year: int, month: int, day: int, hour: int = 0, minute: int = 0, sec: int = 0) -> datetime:
    return datetime(year, month, day, hour, minute, sec, tzinfo=UTC)


# --- parsing ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "field", "expected"),
    [
        ({}, "minute", set(range(60))),
        ({"minute": "*/15"}, "minute", {0, 15, 30, 45}),
        ({"minute": "1-30/5"}, "minute", {1, 6, 11, 16, 21, 26}),
        ({"minute": "1,2, 59"}, "minute", {1, 2, 59}),
        ({"minute": "*/15,7"}, "minute", {0, 7, 15, 30, 45}),
        ({"minute": "*/100"}, "minute", {0}),
        ({"minute": 5}, "minute", {5}),
        ({"minute": {0, 30}}, "minute", {0, 30}),
        ({"minute": [1, 2]}, "minute", {1, 2}),
        ({"hour": "0,8-17/2"}, "hour", {0, 8, 10, 12, 14, 16}),
        ({"hour": "22-2"}, "hour", {22, 23, 0, 1, 2}),
        ({"day_of_week": "mon-fri"}, "day_of_week", {1, 2, 3, 4, 5}),
        ({"day_of_week": "sun"}, "day_of_week", {0}),
        ({"day_of_week": "Sunday,SAT"}, "day_of_week", {0, 6}),
        ({"day_of_week": "sat-mon"}, "day_of_week", {6, 0, 1}),
        ({"day_of_week": "tues,thurs"}, "day_of_week", {2, 4}),
        ({"day_of_week": "7"}, "day_of_week", {0}),
        ({"day_of_week": 7}, "day_of_week", {0}),
        ({"day_of_week": "0-7"}, "day_of_week", set(range(7))),
        ({"day_of_week": "fri-7"}, "day_of_week", {5, 6, 0}),
        ({"day_of_week": "*/2"}, "day_of_week", {0, 2, 4, 6}),
        ({"day_of_month": "1-7,15-21"}, "day_of_month", set(range(1, 8)) | set(range(15, 22))),
        ({"day_of_month": "*/10"}, "day_of_month", {1, 11, 21, 31}),
        ({"month_of_year": "jan"}, "month_of_year", {1}),
        ({"month_of_year": "dec-feb"}, "month_of_year", {12, 1, 2}),
        ({"month_of_year": "*/3"}, "month_of_year", {1, 4, 7, 10}),
        ({"month_of_year": "2-12/2"}, "month_of_year", {2, 4, 6, 8, 10, 12}),
        ({"month_of_year": "September"}, "month_of_year", {9}),
    ],
)
def test_fields_expand_to_sets(kwargs: dict[str, Any], field: str, expected: set[int]) -> None:
    assert getattr(crontab(**kwargs), field) == expected


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"minute": "61"}, "minute='61': 61 is out of range 0-59"),
        ({"minute": 60}, "minute=60: 60 is out of range 0-59"),
        ({"minute": {1, 99}}, "99 is out of range 0-59"),
        ({"hour": "*/0"}, "hour='*/0': step '0' must be a positive whole number"),
        ({"hour": "*/"}, "hour='*/'"),
        ({"hour": "1-5/x"}, "step 'x'"),
        ({"hour": "24"}, "hour='24': 24 is out of range 0-23"),
        ({"day_of_week": "funday"}, "day_of_week='funday': 'funday' is not a number or weekday"),
        ({"day_of_week": "8"}, "8 is out of range 0-7"),
        ({"day_of_week": "jan"}, "'jan' is not a number or weekday name"),
        ({"month_of_year": "13"}, "month_of_year='13': 13 is out of range 1-12"),
        ({"month_of_year": "mon"}, "'mon' is not a number or month name"),
        ({"day_of_month": "0"}, "day_of_month='0': 0 is out of range 1-31"),
        ({"minute": ""}, "minute='': empty part"),
        ({"minute": "1,,2"}, "empty part"),
        ({"minute": "-1"}, "minute='-1'"),
        ({"minute": "1-2-3"}, "bad range '1-2-3'"),
        ({"minute": "5/2"}, "a step needs '*' or a range before it"),
        ({"minute": "jan"}, "'jan' is not a number"),
        ({"minute": set()}, "minute=set(): no values"),
        ({"day_of_month": "31", "month_of_year": "feb"}, "'31' never occurs in month_of_year"),
        ({"day_of_month": "30,31", "month_of_year": [2]}, "never occurs"),
    ],
)
def test_bad_fields_raise_value_error_naming_them(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match="crontab") as excinfo:
        crontab(**kwargs)
    assert message in str(excinfo.value)


def test_parse_errors_are_value_errors() -> None:
    assert issubclass(ParseException, ValueError)
    with pytest.raises(ParseException):
        crontab(minute="*/0")


@pytest.mark.parametrize("value", [1.5, True, ["1"], None])
def test_wrong_types_raise_type_error(value: object) -> None:
    with pytest.raises(TypeError, match="minute"):
        crontab(minute=value)  # type: ignore[arg-type]


def test_from_string_repr_equality_and_hash() -> None:
    c = crontab.from_string("*/15 9-17 1 jan mon-fri")
    assert c == crontab(
        minute="0,15,30,45", hour=range(9, 18), day_of_month=1, month_of_year=1, day_of_week="1-5"
    )
    assert c != crontab(minute="*/15")
    assert hash(c) == hash(crontab("*/15", "9-17", "mon-fri", "1", "jan"))
    assert repr(c) == "<crontab: */15 9-17 1 jan mon-fri (m/h/dM/MY/d)>"
    with pytest.raises(ValueError, match="5 fields"):
        crontab.from_string("* * *")


# --- against Celery's crontab -----------------------------------------------------------------

WEEKDAY_NAMES = ("sun", "mon", "tue", "wed", "thu", "fri", "sat", "sunday", "Friday")
MONTH_NAMES = ("jan", "feb", "mar", "sep", "dec", "December")


def field_st(low: int, high: int, names: tuple[str, ...] = ()) -> st.SearchStrategy[Any]:
    """One crontab field in any of Celery's forms."""
    value = st.integers(low, high).map(str)
    if names:
        value = value | st.sampled_from(names)
    ranges = st.tuples(value, value).map("-".join)  # may wrap around, as 'sat-mon'
    step = st.integers(1, high - low + 2).map(str)
    part = st.one_of(
        st.just("*"),
        value,
        ranges,
        step.map("*/".__add__),
        st.tuples(ranges, step).map("/".join),
    )
    return st.one_of(
        st.just("*"),
        part,
        st.lists(part, min_size=1, max_size=3).map(",".join),
        st.integers(low, high),
        st.sets(st.integers(low, high), min_size=1, max_size=4),
    )


cron_kwargs_st = st.fixed_dictionaries(
    {
        "minute": field_st(0, 59),
        "hour": field_st(0, 23),
        "day_of_week": field_st(0, 6, WEEKDAY_NAMES),
        "day_of_month": st.just("*") | field_st(1, 31),
        "month_of_year": st.just("*") | field_st(1, 12, MONTH_NAMES),
    }
)


@functools.cache
def celery_app(zone: str) -> celery.Celery:
    app = celery.Celery(set_as_current=False)
    app.conf.update(timezone=zone, enable_utc=True)
    return app


@functools.cache
def transitions(zone: str) -> list[datetime]:
    """The instants at which the zone's UTC offset changes, 2015-2030 (on whole hours here)."""
    tz, found = ZoneInfo(zone), []
    day = utc(2015, 1, 1)
    while day.year < 2031:
        offset, day = day.astimezone(tz).utcoffset(), day + timedelta(days=1)
        if day.astimezone(tz).utcoffset() != offset:  # changed during the day: find the hour
            hours = (day - timedelta(hours=h) for h in range(24))
            found.append(min(t for t in hours if t.astimezone(tz).utcoffset() != offset))
    return found or [utc(2020, 1, 1)]


def near_transition_st(zone: str) -> st.SearchStrategy[datetime]:
    return st.builds(
        lambda t, s: t + timedelta(seconds=s),
        st.sampled_from(transitions(zone)),
        st.integers(-2 * 86400, 3 * 3600),
    )


def any_instant_st() -> st.SearchStrategy[datetime]:
    return st.datetimes(datetime(2000, 1, 1), datetime(2035, 12, 31), timezones=st.just(UTC))


def zone_and_instant_st() -> st.SearchStrategy[tuple[str, datetime]]:
    return st.sampled_from(ZONES).flatmap(
        lambda zone: st.tuples(st.just(zone), any_instant_st() | near_transition_st(zone))
    )


def nonexistent(wall: datetime, tz: ZoneInfo) -> bool:
    naive = wall.replace(tzinfo=None)
    return naive.replace(tzinfo=tz).astimezone(UTC).astimezone(tz).replace(tzinfo=None) != naive


def check_against_celery(kwargs: dict[str, Any], zone: str, after: datetime) -> str:
    """Compare ``next_after`` with Celery's next run; return which case it was."""
    tz = ZoneInfo(zone)
    try:
        theirs = celery.schedules.crontab(**kwargs, nowfun=lambda: after, app=celery_app(zone))
    except (ValueError, celery.schedules.ParseException):
        with pytest.raises(ValueError):
            crontab(**kwargs)
        return "invalid"
    ours = crontab(**kwargs)
    for field in ("minute", "hour", "day_of_week", "day_of_month", "month_of_year"):
        assert getattr(ours, field) == getattr(theirs, field), field

    result = ours.next_after(after, tz)
    assert result.tzinfo is UTC
    assert result > after
    assert ours.next_after(result - timedelta(microseconds=1), tz) == result
    assert ours.next_after(after.astimezone(tz), tz) == result  # any aware input, same answer

    celery_next = after + theirs.remaining_estimate(after)
    # remaining_estimate adds Celery's ffwd to last_run_at in wall-clock time; that wall time:
    last_run_at, delta, _ = theirs.remaining_delta(after)
    celery_wall = last_run_at + delta
    if nonexistent(celery_wall, tz):
        # Spring forward: the wall time is skipped. Celery lands as far past the gap as the
        # time was into it (02:30 -> 03:30); we fire at the first instant after the gap.
        assert result <= celery_next
        before_result = (result - timedelta(seconds=1)).astimezone(tz)
        assert result.astimezone(tz).utcoffset() != before_result.utcoffset()
        return "gap"
    elif celery_next <= after:
        # Fall back, during the repeated hour: Celery's ffwd drops fold=1 and answers with the
        # hour's first occurrence, which is already past (its crontab stays due all hour).
        # We fire each wall time once, at its first occurrence, so the next tick comes later.
        assert last_run_at.fold == 1
        assert result > celery_next
        return "repeated hour"
    assert result == celery_next
    return "same"


@settings(max_examples=300, deadline=None)
@given(kwargs=cron_kwargs_st, zone_after=zone_and_instant_st())
def test_next_after_matches_celery(
    kwargs: dict[str, Any], zone_after: tuple[str, datetime]
) -> None:
    check_against_celery(kwargs, *zone_after)


# Expressions and instants where DST matters: hours around the transitions, instants within
# hours of one. Here both documented exceptions come up, besides many plain agreements.
dst_kwargs_st = st.fixed_dictionaries(
    {
        "minute": field_st(0, 59),
        "hour": st.sampled_from(["*", "1-3", "2", "1", "*/2", "0-4/2", "0,2,4"]),
        "day_of_week": st.just("*") | field_st(0, 6, WEEKDAY_NAMES),
    }
)
dst_zone_after_st = st.sampled_from(ZONES[1:]).flatmap(
    lambda zone: st.tuples(
        st.just(zone),
        st.builds(
            lambda t, s: t + timedelta(seconds=s),
            st.sampled_from(transitions(zone)),
            st.integers(-3 * 3600, 2 * 3600),
        ),
    )
)


@settings(max_examples=300, deadline=None)
@given(kwargs=dst_kwargs_st, zone_after=dst_zone_after_st)
def test_next_after_matches_celery_around_dst(
    kwargs: dict[str, Any], zone_after: tuple[str, datetime]
) -> None:
    check_against_celery(kwargs, *zone_after)


def test_around_dst_exercises_every_case() -> None:
    """The DST exceptions above are reached (Berlin 2024: both transitions, by the minute)."""
    cases = set()
    for transition in (utc(2024, 3, 31, 1), utc(2024, 10, 27, 1)):
        for minutes in range(-150, 90, 7):
            after = transition + timedelta(minutes=minutes, seconds=13)
            for kwargs in ({"minute": "*/10"}, {"minute": "30", "hour": "2"}):
                cases.add(check_against_celery(kwargs, "Europe/Berlin", after))
    assert cases == {"same", "gap", "repeated hour"}


# --- daylight saving time: the documented choices (Europe/Berlin) --------------------------------

# 2024-03-31: 02:00 CET (01:00 UTC) jumps to 03:00 CEST. 2024-10-27: 03:00 CEST (01:00 UTC)
# falls back to 02:00 CET, so 02:00-02:59 happens twice (00:00-00:59 and 01:00-01:59 UTC).


def ticks(c: crontab, start: datetime, count: int) -> list[datetime]:
    out = [c.next_after(start, BERLIN)]
    while len(out) < count:
        out.append(c.next_after(out[-1], BERLIN))
    return out


def test_nonexistent_time_fires_at_the_end_of_the_gap() -> None:
    daily = crontab(minute=30, hour=2)
    assert ticks(daily, utc(2024, 3, 30, 12), 3) == [
        utc(2024, 3, 31, 1, 0),  # 03:00 CEST: 02:30 did not exist
        utc(2024, 4, 1, 0, 30),  # 02:30 CEST
        utc(2024, 4, 2, 0, 30),
    ]


def test_gap_ticks_collapse_into_one() -> None:
    quarterly = crontab(minute="*/15")
    assert ticks(quarterly, utc(2024, 3, 31, 0, 40), 3) == [
        utc(2024, 3, 31, 0, 45),  # 01:45 CET
        utc(2024, 3, 31, 1, 0),  # 03:00 CEST, once, for 02:00-02:45 and 03:00 itself
        utc(2024, 3, 31, 1, 15),  # 03:15 CEST
    ]


def test_ambiguous_time_fires_once_at_its_first_occurrence() -> None:
    daily = crontab(minute=30, hour=2)
    assert ticks(daily, utc(2024, 10, 26, 12), 2) == [
        utc(2024, 10, 27, 0, 30),  # 02:30 CEST, the first occurrence
        utc(2024, 10, 28, 1, 30),  # 02:30 CET the next day, not 02:30 CET the same day
    ]
    # From inside the second occurrence of the repeated hour, its wall times are past.
    assert daily.next_after(utc(2024, 10, 27, 1, 10), BERLIN) == utc(2024, 10, 28, 1, 30)


def test_repeated_hour_does_not_tick_twice() -> None:
    quarterly = crontab(minute="*/15")
    assert ticks(quarterly, utc(2024, 10, 27, 0, 40), 3) == [
        utc(2024, 10, 27, 0, 45),  # 02:45 CEST
        utc(2024, 10, 27, 2, 0),  # 03:00 CET: 02:00-02:45 CET already fired as CEST
        utc(2024, 10, 27, 2, 15),
    ]
    assert quarterly.next_after(utc(2024, 10, 27, 1, 20), BERLIN) == utc(2024, 10, 27, 2, 0)


def test_fields_are_wall_clock_in_the_zone() -> None:
    nine = crontab(minute=0, hour=9)
    assert nine.next_after(utc(2024, 1, 10), BERLIN) == utc(2024, 1, 10, 8)  # CET
    assert nine.next_after(utc(2024, 7, 10), BERLIN) == utc(2024, 7, 10, 7)  # CEST
    assert nine.next_after(utc(2024, 7, 10)) == utc(2024, 7, 10, 9)  # default: UTC


def test_naive_after_is_rejected() -> None:
    with pytest.raises(ValueError, match="aware"):
        crontab().next_after(datetime(2024, 1, 1), BERLIN)
    with pytest.raises(ValueError, match="aware"):
        schedule(10).next_after(datetime(2024, 1, 1))


def test_rare_dates_are_found() -> None:
    leap_monday = crontab(minute=0, hour=0, day_of_month=29, month_of_year=2, day_of_week="mon")
    assert leap_monday.next_after(utc(2024, 3, 1), UTC) == utc(2044, 2, 29)
    assert crontab(0, 0, day_of_month=31).next_after(utc(2024, 4, 1), UTC) == utc(2024, 5, 31)


# --- is_due / remaining_estimate ----------------------------------------------------------------


def test_crontab_is_due_and_remaining_estimate() -> None:
    now = utc(2024, 5, 1, 10, 7, 30)
    c = crontab(minute="*/5", nowfun=lambda: now)
    assert c.remaining_estimate(utc(2024, 5, 1, 10, 4)) == timedelta(seconds=-150)  # 10:05
    assert c.is_due(utc(2024, 5, 1, 10, 4)) == (True, 150.0)  # and the next is 10:10
    assert c.is_due(utc(2024, 5, 1, 10, 5)) == (False, 150.0)
    assert c.is_due(datetime(2024, 5, 1, 10, 4)) == (True, 150.0)  # naive means UTC
    theirs = celery.schedules.crontab(minute="*/5", nowfun=lambda: now, app=celery_app("UTC"))
    for last in (utc(2024, 5, 1, 10, 4), utc(2024, 5, 1, 10, 5), utc(2024, 5, 1, 9, 0)):
        assert c.is_due(last) == theirs.is_due(last)
        assert c.remaining_estimate(last) == theirs.remaining_estimate(last)


def test_is_due_uses_the_app_timezone() -> None:
    app = celery_app("Europe/Berlin")
    now = utc(2024, 7, 10, 6, 59)
    ours = crontab(minute=0, hour=9, nowfun=lambda: now, app=app)
    theirs = celery.schedules.crontab(minute=0, hour=9, nowfun=lambda: now, app=app)
    assert ours.is_due(utc(2024, 7, 9, 8)) == theirs.is_due(utc(2024, 7, 9, 8)) == (False, 60)
    pgtasks_app = Celery("schedules")
    pgtasks_app.conf.timezone = "Europe/Berlin"
    assert crontab(nowfun=lambda: now, app=pgtasks_app).tz == BERLIN
    assert crontab(minute=0, hour=9, nowfun=lambda: now, app=pgtasks_app).is_due(now) == (False, 60)
    assert crontab(minute=0, hour=9, nowfun=lambda: now).is_due(now) == (False, 7260)  # UTC


# --- interval schedules -------------------------------------------------------------------------


def test_interval_inputs() -> None:
    assert schedule(300).run_every == schedule(300.0).run_every == timedelta(minutes=5)
    assert schedule(timedelta(minutes=5)) == schedule(300) == timedelta(minutes=5)
    assert schedule(0.25).seconds == 0.25
    assert maybe_schedule(30) == schedule(timedelta(seconds=30))
    assert maybe_schedule(timedelta(hours=1)).run_every == timedelta(hours=1)  # type: ignore[attr-defined]
    c = crontab()
    assert maybe_schedule(c) is c
    with pytest.raises(ValueError, match="positive"):
        schedule(0)
    with pytest.raises(TypeError):
        schedule("10")  # type: ignore[arg-type]


def test_interval_ticks_are_anchored_at_the_epoch_by_default() -> None:
    every_5m = schedule(timedelta(minutes=5))
    assert every_5m.next_after(utc(2024, 1, 1, 10, 2, 1)) == utc(2024, 1, 1, 10, 5)
    assert every_5m.next_after(utc(2024, 1, 1, 10, 5)) == utc(2024, 1, 1, 10, 10)  # strictly after
    anchor = utc(2024, 1, 1, 0, 1, 30)
    assert every_5m.next_after(utc(2024, 1, 1, 10, 2), anchor=anchor) == utc(2024, 1, 1, 10, 6, 30)
    berlin_anchor = anchor.astimezone(BERLIN)
    assert every_5m.next_after(utc(2024, 1, 1, 10, 2), BERLIN, anchor=berlin_anchor) == utc(
        2024, 1, 1, 10, 6, 30
    )


interval_st = st.one_of(
    st.timedeltas(timedelta(microseconds=1), timedelta(days=40)),
    st.floats(0.001, 10**6).map(lambda s: timedelta(seconds=s)).filter(bool),
)


@settings(max_examples=300, deadline=None)
@given(
    every=interval_st,
    afters=st.lists(any_instant_st(), min_size=2, max_size=5),
    anchor=st.none() | any_instant_st(),
)
def test_processes_sharing_an_anchor_agree_on_ticks(
    every: timedelta, afters: list[datetime], anchor: datetime | None
) -> None:
    # Each "process" builds its own schedule (some from seconds) and asks at its own instant.
    seconds = every.total_seconds()
    processes = [
        schedule(every),
        schedule(seconds) if timedelta(seconds=seconds) == every else None,
    ]
    base = EPOCH if anchor is None else anchor
    for after in afters:
        results = {p.next_after(after, anchor=anchor) for p in processes if p is not None}
        assert len(results) == 1
        (result,) = results
        assert after < result <= after + every
        assert (result - base) % every == timedelta(0)
        # Every instant from the tick before up to the tick agrees on it.
        for earlier in (result - every, result - timedelta(microseconds=1)):
            assert schedule(every).next_after(earlier, anchor=anchor) == result


EPOCH = utc(1970, 1, 1)


def test_interval_is_due_keeps_celerys_meaning() -> None:
    now = utc(2024, 1, 1, 10, 0, 20)
    ours = schedule(timedelta(seconds=30), nowfun=lambda: now)
    theirs = celery.schedules.schedule(timedelta(seconds=30), nowfun=lambda: now)
    for last in (utc(2024, 1, 1, 9, 59, 55), utc(2024, 1, 1, 9, 59, 45), utc(2024, 1, 1, 9, 59)):
        assert ours.is_due(last) == theirs.is_due(last)
        assert ours.remaining_estimate(last) == theirs.remaining_estimate(last)
    relative = schedule(timedelta(seconds=30), relative=True, nowfun=lambda: now)
    assert relative.is_due(utc(2024, 1, 1, 9, 59, 55)) == (True, 10.0)  # due at 10:00:00
