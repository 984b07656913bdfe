"""An app with periodic tasks, for the ``pgtasks beat`` tests.

``-A tests.apps.periodic``; the database and schema come from ``PGTASKS_DATABASE_URL`` and
``PGTASKS_SCHEMA_NAME``. Three entries: ``every-second`` (an interval), ``nightly`` (a crontab,
with the ``skip`` missed-tick policy) and ``hourly-report``, added by ``add_periodic_task`` in an
``on_after_configure`` receiver.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from pgtasks import Celery, crontab

app = Celery("periodic", set_as_current=False)

app.conf.beat_schedule = {
    "every-second": {
        "task": "periodic.ping",
        "schedule": timedelta(seconds=1),
        "args": ("hello",),
    },
    "nightly": {
        "task": "periodic.cleanup",
        "schedule": crontab(hour=3, minute=30),
        "kwargs": {"days": 7},
        "options": {"queue": "maintenance"},
        "missed": "skip",
    },
}


@app.task(name="periodic.ping")
def ping(word: str) -> str:
    return word


@app.task(name="periodic.cleanup")
def cleanup(days: int) -> int:
    return days


@app.task(name="periodic.report")
def report(kind: str) -> str:
    return kind


@app.on_after_configure.connect
def add_report(sender: Celery, **kwargs: Any) -> None:
    sender.add_periodic_task(crontab(minute=0), report.s("hourly"), name="hourly-report")
