"""The app the command-line tests start workers of.

The database and schema come from ``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``.
"""

from __future__ import annotations

import time

from pgtasks import Celery

app = Celery("cliapp")


@app.task(name="cliapp.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="cliapp.slow")
def slow(seconds: float) -> str:
    time.sleep(seconds)
    return "finished"
