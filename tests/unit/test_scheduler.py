"""The scheduler's pure parts: which ticks are due under each missed-tick policy, and how
``beat_schedule`` entries are read and checked."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from zoneinfo import ZoneInfo

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pgtasks import Celery, crontab
from pgtasks.exceptions import ImproperlyConfigured
from pgtasks.scheduler import due_ticks, load_entries
from pgtasks.schedules import schedule

UTC = timezone.utc
T0 = datetime(2026, 3, 1, 12, 0, tzinfo=UTC)
NOWHERE = "postgresql://nobody@127.0.0.1:1/nowhere"


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


def test_nothing_is_due_before_the_next_tick() -> None:
    assert due_ticks(crontab(), UTC, T0, T0 + timedelta(seconds=59)) == []
    assert due_ticks(crontab(), UTC, T0, T0 + minutes(1)) == [T0 + minutes(1)]


def test_once_runs_the_latest_missed_tick_only() -> None:
    assert due_ticks(crontab(), UTC, T0, T0 + minutes(10.5), "once") == [T0 + minutes(10)]


def test_all_catches_up_oldest_first_in_batches() -> None:
    ticks = due_ticks(crontab(), UTC, T0, T0 + minutes(10.5), "all")
    assert ticks == [T0 + minutes(n) for n in range(1, 11)]
    assert len(due_ticks(crontab(), UTC, T0, T0 + minutes(500), "all", limit=100)) == 100


def test_skip_drops_ticks_later_than_the_grace() -> None:
    assert due_ticks(crontab(), UTC, T0, T0 + minutes(10.5), "skip", grace=20) == []
    assert due_ticks(crontab(), UTC, T0, T0 + minutes(10.25), "skip", grace=20) == [
        T0 + minutes(10)
    ]


def test_crontab_ticks_follow_the_zone() -> None:
    berlin = ZoneInfo("Europe/Berlin")
    daily = crontab(minute=0, hour=9)
    (tick,) = due_ticks(daily, berlin, T0, T0 + timedelta(days=1))
    assert tick.astimezone(berlin).hour == 9


@settings(max_examples=200, deadline=None)
@given(
    every=st.integers(min_value=1, max_value=7200),
    start=st.integers(min_value=0, max_value=10**6),
    span=st.integers(min_value=0, max_value=20000),
    grace=st.integers(min_value=0, max_value=3600),
)
def test_policies_agree_with_each_other(every: int, start: int, span: int, grace: int) -> None:
    interval = schedule(every)
    after = T0 + timedelta(seconds=start)
    now = after + timedelta(seconds=span)
    every_tick = due_ticks(interval, UTC, after, now, "all", limit=10**6)
    assert every_tick == sorted(set(every_tick))
    assert all(after < t <= now for t in every_tick)
    assert len(every_tick) in (span // every, span // every + 1)
    once = due_ticks(interval, UTC, after, now, "once")
    assert once == every_tick[-1:]
    skipped = due_ticks(interval, UTC, after, now, "skip", grace=grace)
    assert skipped == [t for t in once if now - t <= timedelta(seconds=grace)]


def test_entries_are_read_as_celery_writes_them() -> None:
    app = Celery("beat", broker=NOWHERE, set_as_current=False)
    app.conf.beat_schedule = {
        "quarter": {"task": "proj.report", "schedule": crontab(minute="*/15")},
        "often": {
            "task": "proj.ping",
            "schedule": timedelta(seconds=30),
            "args": [1],
            "kwargs": {"k": "v"},
            "options": {"queue": "io", "expires": 20},
        },
        "plain": {"task": "proj.ping", "schedule": 10.0, "missed": "all"},
    }
    by_name = {e.name: e for e in load_entries(app)}
    assert by_name["quarter"].schedule == crontab(minute="*/15")
    assert by_name["often"].args == (1,) and by_name["often"].options["queue"] == "io"
    assert by_name["often"].schedule == schedule(timedelta(seconds=30))
    assert by_name["plain"].missed == "all"
    assert by_name["quarter"].missed == "once"


@pytest.mark.parametrize(
    ("entry", "message"),
    [
        ({"schedule": 10}, "needs 'task'"),
        ({"task": "t"}, "needs 'schedule'"),
        ({"task": "t", "schedule": "often"}, "beat_schedule entry 'bad'"),
        ({"task": "t", "schedule": 10, "args": 5}, "'args' must be a list or tuple"),
        ({"task": "t", "schedule": 10, "missed": "never"}, "'missed' must be one of"),
        ({"task": "t", "schedule": 10, "every": 3}, "unknown key"),
    ],
)
def test_bad_entries_say_what_is_wrong(entry: dict[str, object], message: str) -> None:
    app = Celery("beat", broker=NOWHERE, set_as_current=False)
    app.conf.beat_schedule = {"bad": entry}
    with pytest.raises(ImproperlyConfigured, match=message):
        load_entries(app)


def test_add_periodic_task_from_on_after_configure() -> None:
    app = Celery("beat", broker=NOWHERE, set_as_current=False)

    @app.task(name="beat.hello")
    def hello(who: str) -> str:
        return who

    @app.on_after_configure.connect
    def setup(sender: Celery, **kwargs: object) -> None:
        sender.add_periodic_task(10.0, hello.s("world"), name="say hello", expires=5)
        sender.add_periodic_task(crontab(hour=7, minute=30), hello.s("morning"))

    entries = {e.name: e for e in load_entries(app)}
    assert entries["say hello"].args == ("world",)
    assert entries["say hello"].options == {"expires": 5}
    assert entries["beat.hello('morning')"].schedule == crontab(hour=7, minute=30)
    assert len(load_entries(app)) == 2, "the signal is sent once"
