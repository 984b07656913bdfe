"""The app the ``status``/``inspect``/``call``/``result`` tests start workers of.

The database and schema come from ``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``.
"""

from __future__ import annotations

import time

from pgtasks import Celery
from pgtasks.exceptions import SoftTimeLimitExceeded

app = Celery("controlapp")


@app.task(name="controlapp.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="controlapp.slow")
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"


@app.task(name="controlapp.fail", max_retries=0)
def fail(message: str) -> None:
    raise ValueError(message)


# Its own limit replaces the worker's --time-limit (a call may only lower it).
@app.task(name="controlapp.patient", time_limit=60)
def patient(seconds: float) -> str:
    try:
        time.sleep(seconds)
    except SoftTimeLimitExceeded:
        return "cleaned up"
    return "finished"
