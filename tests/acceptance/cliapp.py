"""The app the command-line tests start workers of.

The database and schema come from ``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``.
"""

from __future__ import annotations

import time
from typing import Any

from pgtasks import Celery

app = Celery("cliapp")


@app.task(name="cliapp.add")
def add(x: int, y: int) -> int:
    return x + y


@app.task(name="cliapp.slow", bind=True)
def slow(self: Any, seconds: float) -> str:
    # Tells the test the body has begun (a claimed row is RUNNING a moment before that).
    self.update_state(state="SLEEPING")
    time.sleep(seconds)
    return "finished"
