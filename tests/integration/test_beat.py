"""Periodic tasks against a real PostgreSQL: each tick enqueued exactly once by any number of
scheduler processes (one of them killed with ``kill -9`` on the way), missed-tick policies, and
schedule changes. Time moves through the schedulers' injected clock, never by sleeping."""

from __future__ import annotations

import contextlib
import os
import random
import signal
import subprocess
import sys
from collections.abc import Iterator
from datetime import datetime, timedelta
from typing import Any

import psycopg
import pytest

from pgtasks import Celery, crontab
from pgtasks.scheduler import Scheduler
from tests.apps import beat_clock
from tests.apps.harness import REPO, one, rows, wait_until


def minutes(n: float) -> timedelta:
    return timedelta(minutes=n)


@contextlib.contextmanager
def schedulers(pg_dsn: str, schema: str, count: int) -> Iterator[list[subprocess.Popen[bytes]]]:
    env = dict(os.environ)
    env.update(
        PGTASKS_DATABASE_URL=pg_dsn,
        PGTASKS_SCHEMA_NAME=schema,
        PYTHONPATH=os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")])),
    )
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "tests.apps.beat_clock"],
            cwd=REPO,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )
        for _ in range(count)
    ]
    try:
        yield procs
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
            if proc.stderr is not None:
                proc.stderr.close()


def ticks(db: psycopg.Connection[Any], entry: str) -> list[dict[str, Any]]:
    return rows(
        db, "SELECT tick_at, task_id FROM schedule_ticks WHERE name = %s ORDER BY tick_at", (entry,)
    )


def test_five_schedulers_enqueue_each_tick_of_an_hour_once(
    db: psycopg.Connection[Any], pg_dsn: str, schema: str
) -> None:
    start = one(db, "SELECT date_trunc('hour', now()) + interval '1 hour' AS t")["t"]
    beat_clock.install(db, start)
    victim_at = random.randint(10, 50)
    with schedulers(pg_dsn, schema, 5) as procs:
        wait_until(
            lambda: one(db, "SELECT count(*) AS n FROM beat_runners")["n"] == 5,
            timeout=30,
            what="five schedulers to start",
            details=lambda: "\n".join(
                f"exit {p.returncode}" for p in procs if p.poll() is not None
            ),
        )
        for minute in range(1, 61):
            db.execute("UPDATE beat_clock SET now = %s", (start + minutes(minute),))
            if minute == victim_at:
                # Killed while the others race for this very tick.
                os.killpg(procs[0].pid, signal.SIGKILL)
            wanted = start + minutes(minute)
            wait_until(
                lambda wanted=wanted: any(
                    t["tick_at"] == wanted for t in ticks(db, "every-minute")
                ),
                timeout=10,
                what=f"the tick of minute {minute}",
            )
            if minute % 5 == 0:
                wait_until(
                    lambda wanted=wanted: any(
                        t["tick_at"] == wanted for t in ticks(db, "every-five")
                    ),
                    timeout=10,
                    what=f"the five-minute tick of minute {minute}",
                )
        alive = [p for p in procs if p.poll() is None]
        assert len(alive) == 4, "the killed scheduler is the only one gone"
    every_minute = ticks(db, "every-minute")
    assert [t["tick_at"] for t in every_minute] == [start + minutes(m) for m in range(1, 61)]
    every_five = ticks(db, "every-five")
    assert [t["tick_at"] for t in every_five] == [start + minutes(m) for m in range(5, 61, 5)]
    enqueued = rows(
        db, "SELECT id, payload::text AS payload FROM tasks WHERE name = 'beatclock.tick'"
    )
    assert len(enqueued) == 72, "one task per tick, none doubled"
    assert {r["id"] for r in enqueued} == {t["task_id"] for t in every_minute + every_five}
    assert sum(r["payload"].startswith("[[5]") for r in enqueued) == 12
    last = one(db, "SELECT last_tick FROM schedule_entries WHERE name = 'every-minute'")
    assert last["last_tick"] == start + minutes(60)


class Clock:
    """A scheduler's injected notion of now."""

    def __init__(self, now: datetime) -> None:
        self.now = now

    def __call__(self) -> datetime:
        return self.now

    def advance(self, delta: timedelta) -> None:
        self.now += delta


@pytest.fixture
def clock(db: psycopg.Connection[Any]) -> Clock:
    return Clock(one(db, "SELECT date_trunc('hour', now()) AS t")["t"])


def periodic_app(app: Celery, missed: str = "once") -> Celery:
    app.conf.beat_schedule = {
        "minutely": {"task": "beat.job", "schedule": crontab(), "missed": missed},
    }
    return app


def job_count(db: psycopg.Connection[Any]) -> int:
    return int(one(db, "SELECT count(*) AS n FROM tasks WHERE name = 'beat.job'")["n"])


@pytest.mark.parametrize(
    ("missed", "enqueued"), [("once", [1]), ("all", list(range(1, 11))), ("skip", [])]
)
def test_missed_ticks_follow_the_policy(
    app: Celery, db: psycopg.Connection[Any], clock: Clock, missed: str, enqueued: list[int]
) -> None:
    start = clock.now
    scheduler = Scheduler(periodic_app(app, missed), now=clock, grace=20)
    scheduler.tick()
    assert job_count(db) == 0, "a new entry starts with the first tick after it is recorded"
    # Every scheduler was down for ten and a half minutes.
    clock.advance(minutes(10.5))
    scheduler.tick()
    got = [(t["tick_at"] - start) // minutes(1) for t in ticks(db, "minutely")]
    expected = [10] if missed == "once" else enqueued
    assert got == expected
    assert job_count(db) == len(expected)
    # Back to normal: the next tick runs whatever the policy.
    clock.advance(minutes(0.5))
    scheduler.tick()
    assert ticks(db, "minutely")[-1]["tick_at"] == start + minutes(11)


def test_a_tick_is_enqueued_once_by_two_schedulers_in_one_process(
    app: Celery, db: psycopg.Connection[Any], clock: Clock
) -> None:
    first = Scheduler(periodic_app(app), now=clock)
    second = Scheduler(app, now=clock)
    first.tick()
    second.tick()
    clock.advance(minutes(1))
    first.tick()
    second.tick()
    assert job_count(db) == 1


def test_a_changed_schedule_takes_over_from_the_last_tick(
    app: Celery, db: psycopg.Connection[Any], clock: Clock
) -> None:
    start = clock.now
    Scheduler(periodic_app(app), now=clock).tick()
    clock.advance(minutes(1))
    Scheduler(app, now=clock).tick()
    # Redeployed with a new schedule: every five minutes, and a removed entry.
    app.conf.beat_schedule = {
        "minutely": {"task": "beat.job", "schedule": crontab(minute="*/5")},
    }
    clock.advance(minutes(3))
    redeployed = Scheduler(app, now=clock)
    redeployed.tick()
    assert job_count(db) == 1, "minute 4 is no tick of */5"
    clock.advance(minutes(1))
    redeployed.tick()
    assert [t["tick_at"] - start for t in ticks(db, "minutely")] == [minutes(1), minutes(5)]
    row = one(db, "SELECT schedule FROM schedule_entries WHERE name = 'minutely'")
    assert row["schedule"] == "<crontab: */5 * * * * (m/h/dM/MY/d)>"


def test_tick_options_reach_the_task_row(
    app: Celery, db: psycopg.Connection[Any], clock: Clock
) -> None:
    app.conf.beat_schedule = {
        "report": {
            "task": "beat.report",
            "schedule": 60.0,
            "args": (1, "two"),
            "kwargs": {"three": 3},
            "options": {"queue": "reports", "priority": 7, "expires": 30},
        },
    }
    scheduler = Scheduler(app, now=clock)
    scheduler.tick()
    clock.advance(minutes(1))
    assert scheduler.tick() <= 60
    row = one(
        db,
        "SELECT queue, priority, payload::text AS payload, expires_at - created_at AS ttl "
        "FROM tasks WHERE name = 'beat.report'",
    )
    assert (row["queue"], row["priority"]) == ("reports", 7)
    assert row["payload"] == '[[1, "two"], {"three": 3}]'
    assert timedelta(seconds=29) < row["ttl"] <= timedelta(seconds=30)


def test_worker_with_beat_runs_the_schedule(
    app: Celery, db: psycopg.Connection[Any], worker_factory: Any
) -> None:
    ran: list[int] = []

    @app.task(name="beat.every_second")
    def every_second() -> None:
        ran.append(1)

    app.conf.beat_schedule = {"fast": {"task": "beat.every_second", "schedule": 1.0}}
    app.conf.beat_max_loop_interval = 0.1
    with worker_factory(beat=True):
        wait_until(lambda: len(ran) >= 2, timeout=10, what="two ticks to run")
    assert len({t["tick_at"] for t in ticks(db, "fast")}) == len(ticks(db, "fast"))


def test_week_old_tick_rows_are_pruned(
    app: Celery, db: psycopg.Connection[Any], clock: Clock
) -> None:
    scheduler = Scheduler(periodic_app(app), now=clock)
    scheduler.tick()
    for _ in range(2):
        clock.advance(minutes(1))
        scheduler.tick()
    db.execute(
        "UPDATE schedule_ticks SET enqueued_at = now() - interval '8 days' "
        "WHERE tick_at = (SELECT min(tick_at) FROM schedule_ticks)"
    )
    app.broker.prune(3600, 86400)
    assert len(ticks(db, "minutely")) == 1
    # The entry remembers its last tick, so nothing is enqueued again.
    scheduler.tick()
    assert job_count(db) == 2
