"""A worker app whose task hangs, with no time limit, until the test lets it go.

Worker subprocesses load it with ``-A tests.apps.hanging``; the database and schema come from
``PGTASKS_DATABASE_URL`` and ``PGTASKS_SCHEMA_NAME``. The task is steered through files rather
than the database, so that it never needs a connection of its own: it hangs while ``hold``
exists, and writes the pid of the process running it to ``hold`` + ``.pid`` for the test to
watch.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from pgtasks import Celery

app = Celery("hanging", set_as_current=False)

HANG = "hanging.hang"


def pid_file(hold: str | Path) -> Path:
    """Where the task running on ``hold`` writes its pid."""
    return Path(f"{hold}.pid")


def hang(hold: str) -> int:
    """Hang for as long as the file ``hold`` exists; return the pid that ran it."""
    pid_file(hold).write_text(str(os.getpid()), encoding="utf-8")
    while os.path.exists(hold):
        time.sleep(0.02)
    return os.getpid()


app.task(name=HANG)(hang)
