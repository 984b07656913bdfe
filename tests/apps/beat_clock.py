"""A scheduler process whose clock is a row in the test schema, for the exactly-once tests.

Run as ``python -m tests.apps.beat_clock`` with ``PGTASKS_DATABASE_URL`` and
``PGTASKS_SCHEMA_NAME`` set. The test moves ``beat_clock.now`` forward instead of waiting for
minutes to pass; every process reads the same row, as real schedulers read the same database
clock. Each process records its pid in ``beat_runners`` once it has synced the schedule.
"""

from __future__ import annotations

import os
import signal
import threading
from datetime import datetime
from typing import Any

import psycopg
from psycopg import sql

from pgtasks import Celery, crontab
from pgtasks.scheduler import Scheduler
from pgtasks.utils.signal_relay import SignalRelay

app = Celery("beatclock", set_as_current=False)
app.conf.beat_schedule = {
    "every-minute": {"task": "beatclock.tick", "schedule": crontab()},
    "every-five": {"task": "beatclock.tick", "schedule": crontab(minute="*/5"), "args": [5]},
}

TABLES = """
CREATE TABLE IF NOT EXISTS beat_clock (now timestamptz NOT NULL);
CREATE TABLE IF NOT EXISTS beat_runners (pid integer PRIMARY KEY);
"""


def install(conn: psycopg.Connection[Any], start: datetime) -> None:
    """Create the clock (set to ``start``) in ``conn``'s current schema."""
    conn.execute(TABLES)
    conn.execute("DELETE FROM beat_clock")
    conn.execute("INSERT INTO beat_clock (now) VALUES (%s)", (start,))


def main() -> None:
    conn = psycopg.connect(app.database_url, autocommit=True)
    conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(app.settings.schema_name)))

    def clock() -> datetime:
        row = conn.execute("SELECT now FROM beat_clock").fetchone()
        assert row is not None
        return row[0]  # type: ignore[no-any-return]

    stopped = threading.Event()
    scheduler = Scheduler(app, now=clock, max_interval=0.01)
    # As `pgtasks beat` does: set from a handler in the main thread, the event could be waited
    # on (its lock held) right where the signal lands.
    with SignalRelay(lambda _: stopped.set(), (signal.SIGTERM,)):
        scheduler.sync()
        conn.execute("INSERT INTO beat_runners (pid) VALUES (%s)", (os.getpid(),))
        scheduler.run(stopped)


if __name__ == "__main__":
    main()
