"""An app with periodic tasks, written as a Celery project writes them (one import changed).

pgtasks -A examples.periodic.tasks worker -B -l INFO   # on as many hosts as you like
pgtasks -A examples.periodic.tasks beat --list         # each entry's last and next tick
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from typing import Any

from pgtasks import Celery, crontab

# broker= may be omitted: PGTASKS_DATABASE_URL, else an embedded PostgreSQL for development.
app = Celery("periodic")

app.conf.beat_schedule = {
    # Every second (a timedelta, or a number of seconds).
    "heartbeat": {
        "task": "examples.periodic.tasks.heartbeat",
        "schedule": timedelta(seconds=1),
    },
    # Every day at 03:30 in app.conf.timezone (UTC unless set). If every scheduler was down at
    # 03:30, the report is skipped rather than sent late ("once", the default, would send it).
    "nightly-report": {
        "task": "examples.periodic.tasks.report",
        "schedule": crontab(hour=3, minute=30),
        "args": ("daily",),
        "options": {"priority": 3},
        "missed": "skip",
    },
}


@app.task
def heartbeat() -> str:
    now = datetime.now(timezone.utc)
    return f"alive at {now:%H:%M:%S} (pid {os.getpid()})"


@app.task
def report(kind: str) -> str:
    return f"{kind} report sent"


@app.task
def cleanup(older_than_days: int) -> str:
    return f"removed files older than {older_than_days} days"


@app.on_after_configure.connect
def setup_periodic_tasks(sender: Celery, **kwargs: Any) -> None:
    """Entries can also be added in code, as in Celery, once the app is configured."""
    sender.add_periodic_task(2.0, cleanup.s(30), name="cleanup every 2 s")
    sender.add_periodic_task(crontab(minute=0, hour="*/6"), report.s("6-hourly"), name="6-hourly")
